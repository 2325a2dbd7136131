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
    # its own tokens (one model's greedy default is the mixed level): llama.cpp's greedy tokens
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
                                   ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "phrasing": "instruct"}, "phrasing")):  # fmt: skip
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
