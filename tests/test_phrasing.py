"""A member reads a text prompt as `--phrasing` says: raw, or (instruct) a code prompt as its chat
template's instruction with the code repeated in the assistant's turn. Checked against
llama-cpp-python rendering the GGUF's template and decoding greedily itself, in every front end:
generate, the library, the server, presets, eval's variants and the byte level."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from localcos import ByteEnsemble, Ensemble
from localcos.testing import reference
from localcos.testing.loopback import ServeProcess
from localcos.testing.reference import in_child

N = 10
CODE = 'def add(a, b):\n    """Return the sum of a and b."""\n'


def _instruct_greedy(path: str, code: str, n: int) -> tuple[list[int], list[int]]:
    """(the prompt's tokens, n greedy tokens after it), written on llama-cpp-python: the GGUF's
    chat template asked to complete the code, the assistant's turn repeating it."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = reference.reference_llama(path, n_ctx=256)
    try:
        bos = llm._model.token_get_text(llm.token_bos())
        user = "Complete this Python function.\n```python\n" + code + "```"
        text = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], eos_token="", bos_token=bos,
                                   add_generation_prompt=True)(messages=[{"role": "user", "content": user}]).prompt  # fmt: skip
        text += "```python\n" + code
        prompt = llm.tokenize(text.encode(), add_bos=not text.startswith(bos), special=True)
        out: list[int] = []
        for t in llm.generate(prompt, temp=0.0, top_k=1):
            if len(out) == n:
                break
            out.append(t)
        return prompt, out
    finally:
        llm.close()


def _generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", "generate", *args], capture_output=True, text=True, timeout=300)


def test_instruct_reads_the_code_as_the_chat_templates_instruction(models):
    path = str(models["chat"])
    prompt, want = in_child(_instruct_greedy, path, CODE, N)
    # its own tokens: llama.cpp's greedy tokens
    common = ["--models", path, "--prompt", CODE, "--temperature", "0", "--max-tokens", str(N), "--ignore-eos", "--json", "--level", "token"]
    proc = _generate(*common, "--phrasing", "instruct")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["completions"][0]["token_ids"] == want and out["stats"]["prompt_tokens"] == len(prompt)
    raw = json.loads(_generate(*common).stdout)
    assert raw["stats"]["prompt_tokens"] < len(prompt)  # raw: the code alone
    with Ensemble.load([path], n_ctx=256) as ens:  # the library: a generation setting like any other
        assert ens.generate(CODE, phrasing="instruct", temperature=0, max_tokens=N, ignore_eos=True).token_ids == want


def test_the_byte_level_phrases_the_prompt_in_each_models_own_template(models):
    path = str(models["chat"])
    prompt, want = in_child(_instruct_greedy, path, CODE, N)
    with ByteEnsemble.load([path], n_ctx=256, level="byte") as ens:
        assert ens.prompts(CODE, phrasing="instruct") == [prompt]
        assert ens.prompts(CODE) == [ens.models[0].tokenize(CODE)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--phrasing", "instruct", "--chat"], "give it without --chat"),
        (["--phrasing", "plain"], "--phrasing"),
    ],
)
def test_bad_phrasings_are_one_line(models, args, message):
    proc = _generate("--models", str(models["chat"]), "--prompt", CODE, "--max-tokens", "2", *args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_model_without_a_chat_template_cannot_phrase_a_prompt(models):
    proc = _generate("--models", str(models["base"]), "--prompt", CODE, "--max-tokens", "2", "--phrasing", "instruct")
    assert proc.returncode == 2 and "has no chat template" in proc.stderr, proc.stderr


def test_a_server_phrases_text_completions_per_request_and_leaves_chats_their_own(models):
    path = str(models["chat"])
    _, want = in_child(_instruct_greedy, path, CODE, N)
    server = ServeProcess(["--models", path, "--alias", "m"], start_timeout=90)
    try:
        def post(route: str, body: dict) -> httpx.Response:
            return httpx.post(server.url + route, json={"model": "m", "max_tokens": N, "temperature": 0, "ignore_eos": True, **body}, timeout=120)

        out = post("/v1/completions", {"prompt": CODE, "phrasing": "instruct", "return_token_ids": True})
        assert out.status_code == 200 and out.json()["choices"][0]["token_ids"] == want, out.text
        for route, body, param in (("/v1/completions", {"prompt": CODE, "phrasing": "plain"}, "phrasing"),
                                   ("/v1/completions", {"prompt": CODE, "phrasing": "instruct", "echo": True}, "echo"),
                                   ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "phrasing": "instruct"},
                                    "phrasing")):  # fmt: skip
            response = post(route, body)
            assert response.status_code == 400 and response.json()["error"]["param"] == param, (body, response.text)
    finally:
        server.stop()


def test_the_coder_instruct_preset_and_eval_variants_name_the_phrasing(models):
    from localcos.config import resolve
    from localcos.eval.configs import parse_config
    from localcos.models.registry import Registry

    preset = Registry.load(user=False).ensembles["coder-instruct"]
    assert preset.models == ("coder-1.5b",) and preset.settings()["phrasing"] == "instruct"
    base = resolve({"models": [str(models["chat"])]}, decoded=False)
    assert base.generation.phrasing == "raw"
    assert parse_config("instruct=--phrasing instruct", base, [1]).settings.generation.phrasing == "instruct"


def _evalplus_prompt(path: str, code: str) -> list[int]:
    """The prompt's tokens as EvalPlus phrases a task for a chat model, written on
    llama-cpp-python: its instruction with the task in a code block, the assistant's turn its
    response prefix and an opened code block."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = reference.reference_llama(path, n_ctx=256)
    try:
        bos = llm._model.token_get_text(llm.token_bos())
        user = ("Please provide a self-contained Python script that solves the following problem in a markdown code block:\n```\n"
                + code.strip() + "\n```\n")  # fmt: skip
        text = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], eos_token="", bos_token=bos,
                                   add_generation_prompt=True)(messages=[{"role": "user", "content": user}]).prompt  # fmt: skip
        text += (
            "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:\n```python\n"
        )
        return llm.tokenize(text.encode(), add_bos=not text.startswith(bos), special=True)
    finally:
        llm.close()


def test_evalplus_and_auto_read_a_model_as_its_makers_run_it(models):
    from localcos.phrasing import AUTO

    chat, base = str(models["chat"]), str(models["base"])
    with Ensemble.load([chat], n_ctx=256) as ens:
        evalplus = ens.generate(CODE, phrasing="evalplus", temperature=0, max_tokens=2, ignore_eos=True)
        assert evalplus.stats.prompt_tokens == len(in_child(_evalplus_prompt, chat, CODE))
        auto = ens.generate(CODE, phrasing="auto", temperature=0, max_tokens=N, ignore_eos=True)
        made = ens.generate(CODE, phrasing=AUTO, temperature=0, max_tokens=N, ignore_eos=True)
        assert auto.token_ids == made.token_ids and auto.stats.prompt_tokens == made.stats.prompt_tokens
    with Ensemble.load([base], n_ctx=256) as ens:  # no chat template: a base model reads the code itself
        auto = ens.generate(CODE, phrasing="auto", temperature=0, max_tokens=N, ignore_eos=True)
        raw = ens.generate(CODE, temperature=0, max_tokens=N, ignore_eos=True)
        assert auto.token_ids == raw.token_ids and auto.stats.prompt_tokens == len(ens.tokenize(CODE))


def test_a_whole_script_runs_with_its_definitions_after_the_prompt():
    from localcos.eval.codetasks import CodeTask, definitions
    from localcos.eval.sandbox import run_program

    task = CodeTask("t/0", "import math\n\n\ndef area(r):\n    \"\"\"The area of a circle of radius r.\"\"\"\n",
                    "def check(candidate):\n    assert abs(candidate(2) - 4 * math.pi) < 1e-9\n", "area")  # fmt: skip
    script = ("import math\n\n\ndef square(x):\n    return x * x\n\n\ndef area(r):\n    return math.pi * square(r)\n\n\n"
              "print(area(1))\nassert area(1) == 0, 'the script's own check is not the test'\n")  # fmt: skip
    assert "print(" not in definitions(script) and "def square" in definitions(script)
    assert run_program(task.program(script, script=True)).passed
    # a script cut short keeps what parses of it
    assert (
        definitions(script.replace("return math.pi * square(r)", "return math.pi * (")) == "import math\n\ndef square(x):\n    return x * x"
    )
    assert not run_program(task.program("def area(r):\n    return 0\n", script=True)).passed


@pytest.mark.slow
def test_eval_reads_each_model_as_its_makers_run_it_by_default(models, tmp_path):
    """eval's "alone" is the model as made: an instruct GGUF through its chat template, a model
    without one raw; --phrasing raw is a variant of its own."""
    task = {"task_id": "t/0", "prompt": CODE, "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"}
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(json.dumps(task) + "\n")
    texts = {}
    for name in ("chat", "base"):
        results = tmp_path / f"{name}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "localcos", "eval", "--models", str(models[name]), "--task", str(task_file), "--run-code",
                               "--max-tokens", "6", "--level", "token", "--results", str(results), "--variant", "made=", "--variant", "raw=--phrasing raw"],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        records = {json.loads(line)["config"]: json.loads(line) for line in results.read_text().splitlines()[1:]}
        texts[name] = {config: r["completion"] for config, r in records.items()}
        assert set(records) == {"made", "raw"} and records["made"]["settings"]["phrasing"] == "auto", records
    with Ensemble.load([str(models["chat"])], n_ctx=256) as ens:
        stops = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```")
        instruct = ens.generate(CODE, phrasing="instruct", temperature=0, max_tokens=6, stop=stops).text
        raw = ens.generate(CODE, temperature=0, max_tokens=6, stop=stops).text
    assert texts["chat"]["made"] == instruct and texts["chat"]["raw"] == raw and instruct != raw
    assert texts["base"]["made"] == texts["base"]["raw"]
