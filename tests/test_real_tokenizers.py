"""Real tokenizers and real quantisation: models built around llama.cpp's own vocabulary test files
(Qwen2's byte-level BPE, Llama 3's, SentencePiece, Gemma 4's) from the llama-cpp-python sdist the
project pins, quantised by llama.cpp's own quantiser. They never skip in CI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import llama_cpp  # isort: skip
import numpy as np
import pytest

from conftest import assert_same_or_near_tie, within_budget
from localcos import Contrastive, CustomCombiner, Ensemble, WeightedEnsemble
from localcos.backend import Model
from localcos.chat import ChatFormatter, Message
from localcos.core.sampling import Sampler
from localcos.core.text import TextAssembler
from localcos.testing import llamacpp_sdist
from localcos.models.writer import ModelSpec, cached_model
from localcos.testing import reference
from localcos.testing.invariants import checked
from localcos.testing.reference import in_child
from statcheck import assert_matches

PROMPTS = ["The river runs past the old mill", "日本語のテキストと絵文字 🦙 を書く。Naïve café"]



# --- the tokenizer is copied verbatim ---------------------------------------------------------------


@pytest.mark.parametrize("vocab", ["qwen2", "llama-bpe", "llama-spm", "phi-3", "gemma-4"])
def test_written_models_tokenize_exactly_like_llama_cpps_own_test_cases(vocab, llama_vocab, model_dir):
    spec = ModelSpec(tokenizer=str(llama_vocab(vocab)), n_embd=16, n_layer=1, n_head=2, n_ff=32, dtype="f16", name=f"r-tok-{vocab}")
    model = Model(cached_model(spec, model_dir), vocab_only=True)
    cases = llamacpp_sdist.vocab_cases(vocab)
    assert len(cases) > 40
    for text, expected in cases:
        assert model.tokenize(text, add_bos=False) == expected, text


# --- greedy: every method equals the ensemble, and the ensemble equals llama-cpp-python -------------


def reference_greedy(paths, combine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy collaborative decoding written straight on llama-cpp-python's Llama (every model
    evaluates every token, the next token is argmax of the combined scores), for each prompt."""
    return in_child(_reference_greedy, [str(p) for p in paths], combine, prompts, n)


def _reference_greedy(paths, combine, prompts, n):
    return [reference.greedy_combined(paths, combine, prompt, n) for prompt in prompts]


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _we(rows):
    return 0.5 * _softmax(rows[0]) + 0.5 * _softmax(rows[1])


def _cd(rows):
    return rows[1] - 0.5 * rows[0]


# the combiner, and the same combination written by hand for the reference (by name: it runs in a child)
COMBINATIONS = {"we": (WeightedEnsemble([0.5, 0.5]), _we), "cd": (Contrastive(mu=0.5, expert=1), _cd)}


@pytest.mark.parametrize("pair", [("qwen2", "qwen2_sibling"), ("qwen2_q4km", "qwen2_q4km_sibling")], ids=["qwen2-f16", "qwen2-q4_k_m"])
@pytest.mark.parametrize("combine", list(COMBINATIONS))
def test_greedy_methods_equal_the_ensemble_and_a_llama_cpp_python_reference(real_models, pair, combine):
    paths = [real_models[name] for name in pair]
    combiner, reference_combine = COMBINATIONS[combine]
    near_ties = set()
    with Ensemble.load(paths, combiner, n_ctx=128) as ens:
        prompts = [ens.tokenize(text) for text in PROMPTS]
        for prompt, reference in zip(prompts, reference_greedy(paths, reference_combine, prompts, 32)):
            ensemble = ens.generate(prompt, method="ensemble", temperature=0, max_tokens=32, ignore_eos=True)
            near_ties.add(assert_same_or_near_tie(ensemble.token_ids, reference, paths, ens.combiner, prompt, "ensemble vs llama-cpp-python"))
            for method in ("sd", "naive-cos", "cos"):
                out = checked(ens).generate(prompt, method=method, gamma=3, temperature=0, max_tokens=32, ignore_eos=True)
                near_ties.add(assert_same_or_near_tie(out.token_ids, ensemble.token_ids, paths, ens.combiner, prompt, method))
                assert out.stats.proposed > 0
    assert len(near_ties - {None}) <= 1  # near-ties are rare: at most one close call in these prompts


# --- sampling: cos draws from r on a 152k vocabulary ----------------------------------------------------


def test_cos_samples_follow_r_on_the_qwen2_vocabulary(real_models):
    paths = [real_models["qwen2"], real_models["qwen2_sibling"]]
    with Ensemble.load(paths, WeightedEnsemble([0.5, 0.5]), n_ctx=128) as ens:
        prompt = ens.tokenize(PROMPTS[0])

        def exact(prefix):
            rows = []
            for p in paths:
                m = Model(p, n_ctx=128)
                rows.append(m.evaluate(prompt + list(prefix), 1))
                m.close()
            return Sampler().finalize(ens.combiner.combine(rows, 1.0))[0]

        outs = ens.generate_many(prompt, 1500, method="cos", gamma=1, max_tokens=2, seed=7, ignore_eos=True)
        stats = [o.stats for o in outs]
        assert sum(s.rejected for s in stats) > 0.03 * sum(s.proposed for s in stats), "the test must exercise rejections"
        seqs = [tuple(o.token_ids) for o in outs]
        assert_matches(Counter(s[0] for s in seqs), exact(()), "cos token 1")
        (prefix, count), = Counter(s[:1] for s in seqs).most_common(1)
        assert count >= 150
        assert_matches(Counter(s[1] for s in seqs if s[:1] == prefix), exact(prefix), f"cos token 2 after {prefix}")


# --- text: chat template, multi-byte characters, end tokens ---------------------------------------------


def test_chat_prompt_is_the_models_template_rendered_as_llama_cpp_python_renders_it(real_models):
    path = real_models["qwen2"]
    messages = [Message("system", "Be terse."), Message("user", "Where does the river go? 川はどこへ")]
    with Ensemble.load([path, real_models["qwen2_sibling"]], n_ctx=256) as ens:
        formatter = ChatFormatter(ens)
        theirs, their_tokens = in_child(reference.chat_prompt, str(path), [{"role": m.role, "content": m.content} for m in messages])
        assert formatter.text(messages) == theirs
        assert theirs.startswith("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n")
        tokens = formatter.tokens(messages)
        assert tokens == their_tokens
        im_start, im_end = (ens.models[0].tokenize(t, add_bos=False, special=True) for t in ("<|im_start|>", "<|im_end|>"))
        assert len(im_start) == len(im_end) == 1 and tokens.count(im_start[0]) == 3 and tokens.count(im_end[0]) == 2


def _splits_a_character(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_streamed_text_equals_the_final_text_when_tokens_split_characters(real_models):
    with Ensemble.load([real_models["qwen2"], real_models["qwen2_sibling"]], n_ctx=512) as ens:
        model = ens.models[0]
        # a known text whose tokens split CJK characters, emoji and accents
        text = "日本語のテキスト、絵文字 🦙🚀 と naïve café"
        tokens = model.tokenize(text, add_bos=False)
        assert any(_splits_a_character(model.piece(t)) for t in tokens)
        assembler, streamed = TextAssembler(model.piece), []
        for t in tokens:
            assembler.push(t)
            streamed.append(assembler.take_final())
        assembler.finish()
        streamed.append(assembler.take_final())
        assert "".join(streamed) == assembler.text == text
        assert "\ufffd" not in "".join(streamed)
        # a generation on this vocabulary (a third of it is CJK) streams the same text it returns;
        # which seeds draw a token that splits a character depends on the CPU's arithmetic, so
        # every method's generations go on until one did (a few seeds)
        for method in ("ensemble", "cos"):
            split = False
            for seed in range(3, 11):
                stream = ens.stream(PROMPTS[1], method=method, max_tokens=200, seed=seed, ignore_eos=True)
                pieces = list(stream)
                completion = stream.completion
                whole = b"".join(model.piece(t) for t in completion.token_ids).decode("utf-8", errors="replace")
                assert "".join(pieces) == completion.text == whole
                split = any(_splits_a_character(model.piece(t)) for t in completion.token_ids)
                if split:
                    break
            assert split, f"{method}: no generation drew a token that splits a character"


def test_every_end_of_generation_token_ends_a_completion(real_models):
    with Ensemble.load([real_models["qwen2"], real_models["qwen2_sibling"]], n_ctx=128) as ens:
        model = ens.models[0]
        eog = {t for t in range(ens.n_vocab) if llama_cpp.llama_vocab_is_eog(model._vocab, t)}
        by_text = {t: model.token_text(t).decode() for t in eog}
        assert {"<|endoftext|>", "<|im_end|>"} <= set(by_text.values()), by_text
        assert ens.end_tokens == eog
        for end in sorted(eog):
            # a combination that puts all its mass on this end token
            only = CustomCombiner(
                lambda logits, end=end: np.where(np.arange(logits[0].shape[-1]) == end, 0.0, -np.inf) + 0 * logits[0], name="only"
            )
            for method in ("ensemble", "cos"):
                out = ens.generate(PROMPTS[0], combiner=only, method=method, max_tokens=20, seed=1)
                assert (out.token_ids, out.finish_reason) == ([], "stop"), (by_text[end], method)


# --- errors and inspection ------------------------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=300, env=os.environ.copy())


def test_qwen2_with_llama3_is_a_tokenizer_mismatch_in_one_line_at_the_token_level(real_models):
    proc = run("generate", "--models", f"{real_models['qwen2']},{real_models['llama3']}", "--prompt", "Hello", "--level", "token")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == ""
    assert lines[0].startswith("localcos: error: tokenizer mismatch:") and "r-qwen2" in lines[0] and "r-llama3" in lines[0]


def test_qwen2_with_llama3_decodes_at_the_byte_level_by_default(real_models):
    proc = run("generate", "--models", f"{real_models['qwen2']},{real_models['llama3']}", "--prompt", "Hello", "--max-tokens", "8",
               "--seed", "5", "--json", "--ctx", "256")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import json

    result = json.loads(proc.stdout)
    stats = result["stats"]
    (completion,) = result["completions"]
    assert stats["level"] == "byte"
    assert stats["chars"] == len(completion["text"]) and stats["tokens"] <= 8 + 3  # --max-tokens: the lead's tokens
    assert stats["bytes"] == len(completion["text"].encode("utf-8"))  # valid UTF-8 throughout


@pytest.mark.parametrize("gate", [[], ["--gate", "0.6"]], ids=["combined", "gated"])
def test_greedy_byte_level_cos_equals_the_byte_level_ensemble_across_tokenizers(real_models, gate):
    """F16 models: llama.cpp's batched rows equal its single rows closely enough for greedy
    equality, so speculation across tokenizers must give the ensemble's text byte for byte; with
    a gate too (r the lead's own byte distribution where it is sure, the combination elsewhere)."""
    import json

    texts = {}
    for method in ("ensemble", "cos"):
        proc = run("generate", "--models", f"{real_models['qwen2']},{real_models['llama3']}", "--prompt", "Hello", "--max-tokens", "16",
                   "--temperature", "0", "--ignore-eos", "--json", "--ctx", "256", "--method", method, "--byte-gamma", "6", *gate)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        stats = result["stats"]
        assert stats["method"] == method and ("+gate(0.6" in stats["combiner"]) == bool(gate)
        if gate:  # the gate decided every byte, and opened at some of them only
            assert stats["gate_decided"] == stats["bytes"] and 0 < stats["gate_opened"] < stats["bytes"], stats
        texts[method] = result["completions"][0]["text"]
        assert within_budget(stats["tokens"], 16)
    assert texts["cos"] == texts["ensemble"]


def test_models_info_on_real_tokenizers_and_quantisation(real_models):
    info = run("models", "info", str(real_models["qwen2_q4km"]))
    assert info.returncode == 0, info.stderr
    shown = info.stdout.replace("chat template", "chat_template").replace("context length", "context_length")
    lines = dict(line.split(None, 1) if " " in line else (line, "") for line in shown.splitlines())
    assert lines["architecture"].strip() == "qwen2"
    assert lines["quantization"].startswith("Q4_K_M (") and "Q4_K" in lines["quantization"] and "Q6_K" in lines["quantization"]
    assert lines["vocabulary"].strip() == "151936 tokens (gpt2)"
    assert lines["chat_template"].strip() == "yes"
    check = run("models", "check", f"{real_models['qwen2']},{real_models['qwen2_q4km']}")
    assert check.returncode == 0 and "shared vocabulary 151936 tokens" in check.stdout
    as_json = run(
        "generate", "--models", str(real_models["qwen2_q4km"]), "--chat", "--prompt", "Hi", "--max-tokens", "4", "--seed", "1", "--json"
    )
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["stats"]["prompt_tokens"] > 10  # the ChatML template's system turn and markers


@pytest.mark.parametrize("template, message", [("{% for m in messages %}{{ m.content }", r"cannot render r-llama3-bad-template\S*'s chat template: "),
                                               ("{{ raise_exception('no system turns here') }}",
                                                r"r-llama3-bad-template\S*'s chat template refused the conversation: no system turns here")])  # fmt: skip
def test_a_template_that_cannot_render_at_the_byte_level_is_one_line_naming_its_model(
    real_models, model_dir, llama_vocab, template, message
):
    from dataclasses import replace

    from conftest import REAL_SPECS

    _, spec = REAL_SPECS["llama3"]
    bad = cached_model(
        replace(spec, tokenizer=str(llama_vocab("llama-bpe")), chat_template=template, name="r-llama3-bad-template"), model_dir
    )
    proc = run("generate", "--models", f"{real_models['qwen2']},{bad}", "--chat", "--prompt", "Hello", "--max-tokens", "4", "--ctx", "256")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert re.search(message, lines[0]), lines[0]


def test_byte_level_cos_with_few_sequences_per_model_gives_the_ensembles_text(real_models):
    """Two sequences per model, no pruning but the cap: while a draft runs, the paths a snapshot
    may come back to hold their sequences while free ones last, then give them up (a crash once:
    no free sequence was left for a new path)."""
    import json

    texts = {}
    for method in ("ensemble", "cos"):
        proc = run("generate", "--models", f"{real_models['qwen2']},{real_models['llama3']}", "--prompt", "Hello", "--max-tokens", "16",
                   "--temperature", "0", "--ignore-eos", "--json", "--ctx", "256", "--method", method, "--byte-gamma", "4",
                   "--byte-paths", "2", "--byte-prune", "0")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        texts[method] = result["completions"][0]["text"]
        if method == "cos":
            assert result["stats"]["drafted"] > 0
        assert within_budget(result["stats"]["tokens"], 16)
    assert texts["cos"] == texts["ensemble"]


@pytest.mark.parametrize(
    "paths, prune, combine, gamma, method, seed",
    [(1, 0.0, "cd", 2, "ensemble", 0), (1, 0.0, "we", "auto", "cos", 1), (2, 0.2, "cd", 5, "cos", 1), (2, 0.0, "cd", 5, "cos", 1)],
)
def test_untrained_models_at_the_byte_level_go_on_where_a_model_gives_the_byte_drawn_no_mass(
    real_models, paths, prune, combine, gamma, method, seed
):
    """Random F16 models at T=1 with few paths: r draws bytes that a model's held paths, or its
    own rows in float64 prefix sums, give no mass (once: Unreachable out of a restart, or no
    valid UTF-8 byte left). The model follows its own tokenisation of the text, and the text
    goes on, valid UTF-8, to its length."""
    from localcos import ByteEnsemble, Contrastive, WeightedEnsemble

    combiner = Contrastive(mu=0.5, expert=1) if combine == "cd" else WeightedEnsemble([0.5, 0.5])
    with ByteEnsemble.load([real_models["qwen2"], real_models["llama3"]], combiner, n_ctx=256, byte_paths=paths, byte_prune=prune) as ens:
        out = ens.generate("Hello wörld 🦙", max_tokens=16, temperature=1.0, byte_gamma=gamma, seed=seed, method=method, ignore_eos=True)
    assert within_budget(out.stats.tokens, 16) and out.data.decode("utf-8") == out.text
    assert sum(out.stats.restarts) > 0  # what this test is about did happen


@pytest.mark.parametrize(
    "paths, prune, method, gamma", [(3, 0.01, "ensemble", 8), (3, 0.2, "cos", 4), (8, 0.01, "cos", 6), (2, 0.0, "cos", 3)]
)
def test_every_path_is_evaluated_on_its_own_tokens(real_models, monkeypatch, paths, prune, method, gamma):
    """A path's row is llama.cpp's row after the prompt and the path's tokens, so the sequence
    that holds a path must hold exactly those tokens first, after every byte, draft and rollback:
    sequences are taken over, shared and re-seated as paths come and go, and a mistake there
    computes rows from another context, which no NumPy fake can see."""
    from localcos import ByteEnsemble, Contrastive
    from localcos.runtime.bytelevel import ByteMember

    checked = [0]

    def held_exactly(member: ByteMember) -> None:
        for path in member.view.paths:
            if path.handle is not None:
                want = member.prompt + list(path.tokens)
                assert path.handle.tokens[: len(want)] == want, (len(path.tokens), len(path.handle.tokens))
                checked[0] += 1

    for name in ("advance", "rollback"):
        original = getattr(ByteMember, name)

        def wrapped(self, *args, _original=original):
            out = _original(self, *args)
            held_exactly(self)
            return out

        monkeypatch.setattr(ByteMember, name, wrapped)
    with ByteEnsemble.load([real_models["qwen2"], real_models["llama3"]], Contrastive(mu=0.5, expert=1), n_ctx=512, byte_paths=paths,
                           byte_prune=prune) as ens:  # fmt: skip
        for seed in range(3):
            out = ens.generate(
                "Hello wörld 🦙 def f(x):", max_tokens=24, temperature=1.0, byte_gamma=gamma, seed=seed, method=method, ignore_eos=True
            )
            assert within_budget(out.stats.tokens, 24)
    assert checked[0] > 200


def test_the_byte_level_makes_the_calls_its_profiles_say_cost_least(real_models):
    """Every tokenisation held is a row; where the profile says rows cost more together than
    apart, each row gets a call of its own, and the greedy text is the one that one call for all
    gives (F16: batched rows equal single rows closely enough)."""
    from localcos import ByteEnsemble, WeightedEnsemble
    from localcos.core.speedmodel import CallProfile

    apart = CallProfile({1: 1.0, 2: 2.5, 4: 5.5})  # every row dearer beside another
    together = CallProfile({1: 1.0, 2: 1.01, 4: 1.02, 8: 1.05})
    texts, shapes = {}, {}
    with ByteEnsemble.load([real_models["qwen2"], real_models["llama3"]], WeightedEnsemble([0.5, 0.5]), n_ctx=256, byte_paths=8,
                           byte_prune=0.0) as ens:  # fmt: skip
        for name, profile in (("together", together), ("apart", apart)):
            calls: list[tuple[int, ...]] = []
            for member in ens.members:
                member.price = profile
                original = member.model.decode

                def decode(parts, _original=original, _calls=calls):
                    _calls.append(tuple(last - first for _, _, first, last in parts))
                    return _original(parts)

                member.model.decode = decode
            done = ens.generate("Hello wörld, def f(x):", max_tokens=20, temperature=0.0, method="ensemble", ignore_eos=True)
            texts[name] = done.text
            assert within_budget(done.stats.tokens, 20)
            for member in ens.members:
                del member.model.decode
            shapes[name] = calls
    assert any(len(c) > 1 for c in shapes["together"])  # tokenisations met at one byte: one call held them
    assert all(c == (1,) for c in shapes["apart"]), shapes["apart"]
    assert texts["apart"] == texts["together"]


@pytest.mark.parametrize("method, paths", [("ensemble", 8), ("cos", 3)])
def test_byte_members_keep_their_sequences_exact_through_bytes_drafts_and_rollbacks(real_models, monkeypatch, method, paths):
    """The real `ByteMember` over llama.cpp (no stand-in): after every byte, and after every
    rollback of a draft, each held tokenisation has a sequence of its own holding exactly the
    prompt and its tokens, llama.cpp's cache holds as many positions as the slot says, and no
    sequence is lost or held twice."""
    from localcos import ByteEnsemble, WeightedEnsemble
    from localcos.runtime.bytelevel import ByteMember

    checked = {"step": 0, "rollback": 0}

    def check(member: ByteMember, what: str) -> None:
        seqs = [p.handle for p in member.view.paths]
        assert len({id(s) for s in seqs}) == len(seqs), what
        for path in member.view.paths:
            want = member.prompt + list(path.tokens)
            assert path.handle.tokens[: len(want)] == want, what
        held, free = {id(s) for s in seqs}, {id(s) for s in member.free}
        assert not held & free and held | free == {id(s) for s in member.slots}, what
        assert all(slot.kv_length() == len(slot.tokens) for slot in member.model.slots), what
        checked[what] += 1

    settle, rollback = ByteMember._settle, ByteMember.rollback  # _settle: after every byte's rows
    monkeypatch.setattr(ByteMember, "_settle", lambda self: (settle(self), check(self, "step")))
    monkeypatch.setattr(ByteMember, "rollback", lambda self, state: (rollback(self, state), check(self, "rollback")))
    with ByteEnsemble.load([real_models["qwen2"], real_models["llama3"]], WeightedEnsemble([0.5, 0.5]), n_ctx=256, byte_paths=paths,
                           byte_prune=0.0) as ens:  # fmt: skip
        for seed in (1, 2):
            out = ens.generate(
                "Hello wörld, def f(x):", max_tokens=12, temperature=1.0, seed=seed, method=method, byte_gamma=6, ignore_eos=True
            )
            assert within_budget(out.stats.tokens, 12)
    assert checked["step"] > 40 and (checked["rollback"] > 0) == (method == "cos")
