"""The mixed level (docs/algorithm.md, section 12): whole tokens of the lead where its likeliest
whole token has at least the gate's probability and its view is one tokenisation at a character
boundary, the byte level elsewhere. Sampled exactly (the process's law enumerated by brute force
on fakes), greedy its argmax at every step (a byte step at the lead's boundary spelled by the
lead's likeliest token beginning with that byte), and on llama.cpp models with real tokenizers
the token level's text at gate 0."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from bytefakes import VOCAB_A, VOCAB_B, BruteForce, FakeMember, TinyModel, complete_utf8, valid_utf8_prefix
from localcos import Contrastive, Guidance, WeightedEnsemble
from localcos.core.level import Level
from localcos.core.combiners import Gated
from localcos.core.sampling import Sampler
from localcos.runtime.bytelevel import combine_symbols
from localcos.runtime.bytelevel.generation import ByteGeneration, run_to_end
from statcheck import assert_matches

PROMPT = (0, 1)
LENGTH = 4  # characters per sampled string


def _chars(s: bytes) -> int:
    """Complete characters in s (what max_chars counts)."""
    try:
        return len(s.decode("utf-8"))
    except UnicodeDecodeError as e:
        return len(s[: e.start].decode("utf-8"))


def _held(model: TinyModel, context: tuple[int, ...], rel: bytes) -> list[tuple[tuple[int, ...], int]]:
    """The tokenisations an exact byte view started at `context` holds after `rel`, by brute
    force: (tokens, bytes they cover); a path that stops short of the end of rel is held while
    some token it may take next begins with the rest and reaches past it."""
    out = []

    def walk(tokens: tuple[int, ...], pos: int) -> None:
        p = model.probs(context + tokens)
        rest = rel[pos:]
        if not rest:
            out.append((tokens, pos))
            return
        if any(p[t] > 0 and len(piece) > len(rest) and piece.startswith(rest) for t, piece in enumerate(model.pieces)):
            out.append((tokens, pos))
        for t, piece in enumerate(model.pieces):
            if piece and p[t] > 0 and rest.startswith(piece):
                walk(tokens + (t,), pos + len(piece))

    walk((), 0)
    return out


def _whole_tokens(model: TinyModel, context: tuple[int, ...]) -> np.ndarray:
    """q of the token step: over token ids, then END (the end tokens together), the tokens that
    would not follow a character boundary whole given nothing."""
    p = model.probs(context)
    q = np.zeros(len(model.pieces) + 1)
    for t, piece in enumerate(model.pieces):
        if piece and valid_utf8_prefix(piece):
            q[t] = p[t]
    q[-1] = sum(p[t] for t in model.end_tokens)
    return q / q.sum()


def mixed_step(models: list[TinyModel], bound, lead: int, gate: float, base: tuple[int, ...], rel: bytes, s: bytes, prompts):
    """The rule's next step from a state (the lead's tokens `base` at its last token step, the
    bytes `rel` since, the text `s`), by brute force, each member after its own prompt: ("token",
    the lead's tokens now, q over token ids then END) or ("byte", r over the 257 symbols, UTF-8
    applied)."""
    held = _held(models[lead], prompts[lead] + base, rel)
    if complete_utf8(s) and len(held) == 1 and held[0][1] == len(rel):  # one tokenisation, at a boundary
        tokens = base + held[0][0]
        q = _whole_tokens(models[lead], prompts[lead] + tokens)
        if q.max() >= gate:
            return "token", tokens, q
    dists = [BruteForce(models[lead], prompts[lead] + base).next_symbol(rel) if i == lead else BruteForce(m, prompts[i]).next_symbol(s)
             for i, m in enumerate(models)]  # fmt: skip
    r = combine_symbols(bound, dists, 1.0)
    allowed = np.array([valid_utf8_prefix(s + bytes([b])) for b in range(256)] + [complete_utf8(s)])
    r = np.where(allowed, r, 0.0)
    return "byte", base, r / r.sum()


def mixed_distribution(models: list[TinyModel], combiner, lead: int, gate: float, length: int, prompts=None) -> dict[tuple[bytes, bool], float]:
    """The law of the mixed level's output, (bytes, ended) -> probability, every step of
    `mixed_step` enumerated (each member after its own prompt: `prompts`, default PROMPT)."""
    bound = combiner.bind(len(models), [1, 2])
    prompts = prompts or [PROMPT] * len(models)
    out: dict[tuple[bytes, bool], float] = {}

    def record(s: bytes, ended: bool, mass: float) -> None:
        out[(s, ended)] = out.get((s, ended), 0.0) + mass

    def walk(base: tuple[int, ...], rel: bytes, s: bytes, mass: float) -> None:
        kind, tokens, p = mixed_step(models, bound, lead, gate, base, rel, s, prompts)
        if p[-1] > 0:
            record(s, True, mass * p[-1])
        units = models[lead].pieces if kind == "token" else [bytes([b]) for b in range(256)]
        for t, piece in enumerate(units):
            if p[t] > 0:
                emit(tokens + (t,) if kind == "token" else tokens, b"" if kind == "token" else rel + piece, s, piece, mass * p[t])

    def emit(base: tuple[int, ...], rel: bytes, s: bytes, piece: bytes, mass: float) -> None:
        for b in piece:  # a token's bytes count characters one by one, as the generation does
            s += bytes([b])
            if _chars(s) >= length:
                record(s, False, mass)
                return
        walk(base, rel, s, mass)

    walk((), b"", b"", 1.0)
    return out


def sample(models, combiner, lead: int, gate: float, n: int, seed: int, temperature: float = 1.0, prompts=None):
    members = [FakeMember(m) for m in models]
    prompts = prompts or [PROMPT] * len(models)
    bound = combiner.bind(len(models), [1, 2])  # gated, as the mixed level's combination is: its gate decides whole tokens too
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    token_bytes = 0
    for _ in range(n):
        gen = ByteGeneration(members, prompts, bound, Sampler(temperature=temperature), rng, max_chars=LENGTH,
                             level=Level.MIXED)  # fmt: skip
        c = run_to_end(gen)
        counts[(c.data, c.finish_reason == "stop")] += 1
        token_bytes += c.stats.token_bytes
    return counts, token_bytes


CASES = {
    # one model: its own tokens where sure, its bytes elsewhere
    "alone": ([VOCAB_A], Gated(WeightedEnsemble(), 0.4, lead=0), 0, 0.4),
    # two tokenizers: the lead's tokens where sure; where not, the byte level's gated mixture
    "two-tokenizers": ([VOCAB_A, VOCAB_B], Gated(WeightedEnsemble([0.5, 0.5]), 0.4, lead=0), 0, 0.4),
    # the other tokenizer leads (its whole tokens, its gate), contrasted with the first where unsure
    "the other leads": ([VOCAB_A, VOCAB_B], Gated(Contrastive(mu=0.5, expert=1), 0.4, lead=1), 1, 0.4),
    # one model under two prompts (prompt members): guided, and contrasted with itself where unsure
    # (gate 0.5: enough byte steps that the second prompt moves the law well past the test's power)
    "guidance": ([VOCAB_A, VOCAB_A], Gated(Guidance(scale=1.5, positive=0), 0.5, lead=0), 0, 0.5),
    "self-contrast": ([VOCAB_A, VOCAB_A], Gated(Contrastive(mu=0.5, expert=0), 0.5, lead=0), 0, 0.5),
}
SECOND_PROMPT = (1,)  # what the second member of a model twice reads


def _prompts(models: list[TinyModel]) -> list[tuple[int, ...]] | None:
    """Each member's prompt: a model named twice is one model under two prompts."""
    return [PROMPT, SECOND_PROMPT] if len(models) == 2 and models[0] is models[1] else None


@pytest.mark.parametrize("case", list(CASES))
def test_the_mixed_level_samples_its_process_exactly(case):
    models, combiner, lead, gate = CASES[case]
    prompts = _prompts(models)
    exact = mixed_distribution(models, combiner, lead, gate, LENGTH, prompts)
    assert abs(sum(exact.values()) - 1) < 1e-9
    if prompts is not None:  # the second prompt changes the law: a member reading the first would not pass
        assert max(abs(exact.get(k, 0) - p) for k, p in mixed_distribution(models, combiner, lead, gate, LENGTH).items()) > 0.05
    counts, token_bytes = sample(models, combiner, lead, gate, 4000, seed=61, prompts=prompts)
    total_bytes = sum(len(data) * c for (data, _), c in counts.items())
    assert 0 < token_bytes < total_bytes, "both kinds of step must be exercised"
    keys = sorted(exact)
    index = {k: i for i, k in enumerate(keys)}
    unknown = [k for k in counts if k not in index]
    assert not unknown, f"outcomes of probability 0: {unknown[:3]}"
    assert_matches(Counter({index[k]: c for k, c in counts.items()}), np.array([exact[k] for k in keys]), f"mixed level, {case}")


# one model, reseeded: cases where greedy over bytes across tokens writes another text than the
# lead's spelling of each byte step in one token
RESEEDED = {f"alone, seed {seed}": ([TinyModel(VOCAB_A.pieces, VOCAB_A.end_tokens, seed=seed)], Gated(WeightedEnsemble(), 0.6, lead=0), 0, 0.6)
            for seed in (10, 15, 17, 30, 39)}  # fmt: skip


def test_greedy_takes_each_steps_argmax_and_the_lead_spells_a_byte_step_from_its_boundary():
    followed = 0
    for case, (models, combiner, lead, gate) in {**CASES, **RESEEDED}.items():
        prompts = _prompts(models) or [PROMPT] * len(models)
        counts, token_bytes = sample(models, combiner, lead, gate, 1, seed=1, temperature=0, prompts=_prompts(models))
        ((data, ended),) = counts
        assert _greedy_reference(models, combiner, lead, gate, prompts) == (data, ended), case
        followed += _greedy_reference(models, combiner, lead, gate, prompts, follow=False) != (data, ended)
    assert followed, "the lead's spelling of a byte step must change some case's text (else this test has no power over it)"


def _descent(model: TinyModel, q: np.ndarray, spelled: bytes) -> int | None:
    """The lead's token spelling a byte step that began with `spelled`, by brute force: among its
    whole tokens (q > 0) that begin with the bytes so far, the token of exactly those bytes if it
    is at least as likely as those going on with any one byte together, else that byte, on."""
    while True:
        under = [t for t, pc in enumerate(model.pieces) if pc.startswith(spelled) and valid_utf8_prefix(pc) and q[t] > 0]
        if not under:
            return None
        exact = [t for t in under if model.pieces[t] == spelled]
        on: dict[int, float] = {}
        for t in under:
            if len(model.pieces[t]) > len(spelled):
                on[model.pieces[t][len(spelled)]] = on.get(model.pieces[t][len(spelled)], 0.0) + q[t]
        byte = min(on, key=lambda c: (-on[c], c)) if on else None
        if byte is not None and on[byte] > sum(q[t] for t in exact):
            spelled += bytes([byte])
            continue
        return min(exact, key=lambda t: (-q[t], model.pieces[t]))


def _greedy_reference(models, combiner, lead, gate, prompts, follow: bool = True):
    """Every step's argmax, by the brute-force rule (`mixed_step`); with `follow`, a byte step
    taken where the lead's one tokenisation ends at a character boundary is spelled by the
    lead's token its greedy descent from that byte reaches (`_descent`, where it has one)."""
    bound = combiner.bind(len(models), [1, 2])
    model = models[lead]
    base, rel, s = (), b"", b""
    while True:
        kind, tokens, p = mixed_step(models, bound, lead, gate, base, rel, s, prompts)
        k = int(np.argmax(p))
        if k == len(p) - 1:
            return s, True
        if kind == "token":
            piece, base, rel = model.pieces[k], tokens + (k,), b""
        else:
            piece, base, rel = bytes([k]), tokens, rel + bytes([k])
            held = _held(model, prompts[lead] + tokens, rel[:-1])
            if follow and complete_utf8(s) and len(held) == 1 and held[0][1] == len(rel) - 1:
                t = _descent(model, model.probs(prompts[lead] + tokens + held[0][0]), piece)
                if t is not None:
                    piece, base, rel = model.pieces[t], tokens + held[0][0] + (t,), b""
        for b in piece:
            s += bytes([b])
            if _chars(s) >= LENGTH:
                return s, False


def test_the_mixed_level_needs_a_gate_and_the_ensembles_step(real_models):
    from localcos import ByteEnsemble, Contrastive
    from localcos.errors import ConfigError

    qwen, llama = real_models["qwen2"], real_models["llama3"]
    with ByteEnsemble.load([qwen, llama], Contrastive(mu=0.1, expert=0), n_ctx=256, level="mixed") as ens:
        with pytest.raises(ConfigError, match="--level mixed needs --gate G"):
            ens.generate("x", max_tokens=4)
        gated = Gated(Contrastive(mu=0.1, expert=0), 0.5)
        with pytest.raises(ConfigError, match="--method cos: not available at the mixed level"):
            ens.generate("x", max_tokens=4, combiner=gated, method="cos")
        out = ens.generate("The river", max_tokens=24, combiner=gated, temperature=0)
        assert out.stats.token_bytes is not None and out.stats.to_dict()["level"] == "mixed"


def _generate(models, *args):
    proc = subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", ",".join(map(str, models)), "--prompt", "The river runs",
                           "--temperature", "0", "--max-tokens", "20", "--ignore-eos", "--json", "--ctx", "256", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    return out["completions"][0]["text"], out["stats"]


def test_on_llama_cpp_models_gate_near_0_is_the_leads_tokens_and_gate_1_its_spelled_bytes(real_models):
    """One model with a real tokenizer: at gate ~0 every step at a boundary takes a whole token,
    which is the model's own greedy text on its tokens; at gate 1 (the lead never certain) every
    step is a byte step that the lead spells whole; in between both kinds of step happen."""
    qwen = real_models["qwen2"]
    own, _ = _generate([qwen], "--level", "token")  # llama.cpp's own decoding of its tokens
    tokens, stats0 = _generate([qwen], "--level", "mixed", "--gate", "1e-9")
    assert stats0["level"] == "mixed" and stats0["token_bytes"] == stats0["bytes"] > 0
    # max_tokens: the same length at every level, the lead's tokens: every step a whole token, its own text cut where it cuts alone
    assert tokens == own and stats0["tokens"] == 20
    # at gate 1 the lead is never sure: r chooses each step's first byte and the lead spells it
    # with a whole token, so the text is the lead's tokens, and another text than its own greedy
    spelled, stats1 = _generate([qwen], "--level", "mixed", "--gate", "1")
    assert stats1["token_bytes"] == stats1["bytes"] > 0 and stats1["tokens"] == 20 and spelled != own
    assert stats1["gate_opened"] == stats1["gate_decided"] == 20
    _, stats = _generate([qwen], "--level", "mixed", "--gate", "0.3")
    assert 0 < stats["gate_opened"] < stats["gate_decided"]
    # a second tokenizer consulted only at byte steps: never where every step is a whole token
    mixed, both = _generate([qwen, real_models["llama3"]], "--level", "mixed", "--gate", "0.9", "--combine", "we")
    assert 0 < both["gate_opened"] < both["gate_decided"] and both["calls"][1] > 0
    # (a context the skipped bytes cannot fill: a lazy member takes them where they could reach its end)
    _, tokens_only = _generate([qwen, real_models["llama3"]], "--level", "mixed", "--gate", "1e-9", "--combine", "we", "--ctx", "1024")
    assert tokens_only["token_bytes"] == tokens_only["bytes"] > 0 and tokens_only["calls"][1] == 0


def test_bench_and_score_at_the_mixed_level(real_models, tmp_path):
    qwen = str(real_models["qwen2"])
    proc = subprocess.run([sys.executable, "-m", "localcos", "bench", "--models", qwen, "--level", "mixed", "--gate", "0.3", "--limit-prompts", "1",
                           "--max-tokens", "24", "--temperature", "0", "--json", str(tmp_path / "b.json")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["level"] == "mixed" and [r["config"] for r in report["summary"]] == ["ensemble", "alone-0"]  # the model on its own tokens beside
    assert all(0 <= r["host_fraction"] < 1 for r in report["summary"]) and "host" in proc.stdout
    # same text: the prompts where the model alone wrote the mixed level's very text, and the speed there
    texts = {r["config"]: r["text"] for r in report["runs"]}
    alone = report["summary"][1]
    assert alone["same_text"] == (texts["alone-0"] == texts["ensemble"]) and report["summary"][0]["same_text"] is None
    assert (alone["vs_ensemble_there"] is not None) == bool(alone["same_text"])
    assert ("the mixed level, where alone-0 wrote the same text" in proc.stdout) == bool(alone["same_text"])
    score = subprocess.run([sys.executable, "-m", "localcos", "score", "--models", qwen, "--level", "mixed", "--gate", "0.3", "--file", __file__],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = score.stderr.strip().splitlines()
    assert score.returncode == 2 and len(lines) == 1 and "--level mixed is a way of decoding" in lines[0]


@pytest.mark.parametrize("ignore_end", [False, True])
def test_a_greedy_token_step_reads_the_likeliest_token_from_the_logits_alone(ignore_end):
    """The greedy token step's shortcut (`ByteView.likeliest_token`: one float32 pass over the
    logits) picks the token `token_probs` (the whole distribution, float64) would, with its
    probability among the whole tokens and its log-probability among every token, ties to the
    first in sorted order; rows of many shapes, a duplicate piece's tie and an end likelier than
    any whole token among them."""
    from localcos.core.bytelevel import ByteVocab, ByteView

    pieces = [b"a", b"b", b"ab", b"\xc3", b"\xa9", b"\xc3\xa9", b"a", b"", b"", b"ba", b"\xa9x"]
    vocab = ByteVocab(pieces, end_tokens=[7], name="t")
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(len(pieces)).astype(np.float32) * s for s in (0.5, 2, 8) for _ in range(200)]
    tie = np.zeros(len(pieces), dtype=np.float32)
    tie[0] = tie[6] = 5.0  # b"a" twice: the first in sorted order wins
    ending = np.zeros(len(pieces), dtype=np.float32)
    ending[7] = 9.0
    for row in [*rows, tie, ending]:
        view = ByteView(vocab, max_paths=4, prune=0.0)
        view.start(row)
        q = view.token_probs(np.empty(vocab.size + 1))
        if ignore_end:
            q[-1] = 0.0
            q /= q.sum()
        k, top, log_p = view.likeliest_token(ignore_end)
        assert k == int(np.argmax(q)) and top == pytest.approx(float(q.max()), rel=1e-5)
        if k < vocab.size:
            assert log_p == pytest.approx(np.log(view.paths[0].row.prob(k)), abs=1e-5)
        else:
            assert log_p == pytest.approx(np.log(view.paths[0].row.end), abs=1e-5)


def test_one_model_decodes_its_own_tokens_by_default_and_the_mixed_level_when_asked(real_models):
    """`generate` of one model: its own tokens unless asked otherwise, llama.cpp's own decoding,
    token for token the token level's text (greedy or sampled); `--level mixed` decodes at the
    mixed level (gate 0.5; its stats say so). The Python API gives the same texts, in one
    `Completion` type at both levels."""
    from localcos import ByteEnsemble, Completion, Ensemble

    qwen = real_models["qwen2"]
    default, stats = _generate([qwen])
    assert stats["level"] == "token" and stats["tokens"] == 20
    with Ensemble.load([qwen], n_ctx=256) as ens:
        own = ens.generate("The river runs", temperature=0, max_tokens=20, ignore_eos=True)
    assert type(own) is Completion and own.text == default and own.token_ids is not None and own.length == len(own.token_ids) == 20
    mixed, mixed_stats = _generate([qwen], "--level", "mixed")
    assert mixed_stats["level"] == "mixed" and "gate(0.5" in mixed_stats["combiner"] and 0 < mixed_stats["token_bytes"] <= mixed_stats["bytes"]
    with ByteEnsemble.load([qwen], n_ctx=256, level="mixed") as byte_ens:
        out = byte_ens.generate("The river runs", temperature=0, max_tokens=20, ignore_eos=True)
    # the mixed level's text is bytes in no one model's tokens: no token ids; its length is the lead's tokens
    assert type(out) is Completion and out.text == mixed and out.token_ids is None and out.data is not None and out.data.decode() == out.text
    assert out.length == out.stats.tokens == mixed_stats["tokens"] and out.stats.level == Level.MIXED
    _, sampled = _generate([qwen], "--temperature", "1", "--seed", "3")
    assert sampled["level"] == "token"  # its own law: its own tokens
