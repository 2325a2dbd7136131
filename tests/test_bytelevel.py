"""The byte-level view of a tokenised model (`core.bytelevel`): exact against brute force over
token sequences, on tiny models with deliberately ambiguous vocabularies."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from bytefakes import VOCAB_A, VOCAB_B, BruteForce, FakeMember, TinyModel, all_strings, alphabet_of, string_distribution
from statcheck import assert_matches

from localcos.core.bytelevel import END, ByteView, ByteVocab, Unreachable, check_prune
from localcos.core.combiners import Contrastive, Gated, WeightedEnsemble
from localcos.core.sampling import Sampler
from localcos.core.speedmodel import ByteAutoGamma, CallProfile, Costs
from localcos.errors import ConfigError
from localcos.runtime import Completion
from localcos.runtime.bytelevel import RULED_OUT, ByteGeneration, run_to_end
from localcos.stats import GenerationStats

PROMPT = (0, 1)


def view_after(model: TinyModel, s: bytes, **options) -> ByteView:
    """A view of `model` after PROMPT, advanced through `s`, every new path evaluated."""
    options.setdefault("max_paths", 10**6)  # exact unless a test caps it
    view = ByteView(ByteVocab(model.pieces, model.end_tokens), **options)
    view.start(model.logits(PROMPT))
    for b in s:
        for path in view.advance(b).new:
            view.set_row(path, model.logits(PROMPT + path.tokens))
        view.settle()
    return view


@pytest.mark.parametrize("model", [VOCAB_A, VOCAB_B], ids=["A", "B"])
def test_next_byte_equals_brute_force_marginalisation(model):
    brute = BruteForce(model, PROMPT)
    checked = 0
    for s in all_strings(alphabet_of(VOCAB_A, VOCAB_B), 4):
        if brute.prefix(s) <= 0:
            continue
        expected = brute.next_symbol(s)
        got = view_after(model, s).distribution()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9, err_msg=repr(s))
        checked += 1
    assert checked > 40  # the ambiguous strings were reached, not just the empty one


def test_paths_cover_every_tokenisation_and_pruning_counts_what_it_drops():
    s = b"ababa"
    exact = view_after(VOCAB_A, s)
    assert exact.dropped == 0.0
    assert exact.most_paths >= 3  # 'ab'+'aba', 'aba'+'ba', 'a'+'b'+... held at once
    capped = view_after(VOCAB_A, s, max_paths=1)
    assert 0 < capped.dropped < 1
    assert len(capped.paths) == 1
    # what is kept is a distribution still, close to the exact one when little was dropped
    assert capped.distribution().sum() == pytest.approx(1.0)
    pruned = view_after(VOCAB_A, s, prune=0.5)
    assert pruned.dropped > 0
    assert all(p.log_mass > -np.inf for p in pruned.paths)


@dataclass(frozen=True)
class TextModel(TinyModel):
    """A model whose next-token logits depend on the text its context spells, not on how it is
    tokenised: every tokenisation reaching one position predicts alike."""

    def logits(self, context):
        text = b"".join(self.pieces[t] for t in context)
        return TinyModel.logits(self, tuple(text))


def test_paths_that_reach_one_position_and_predict_alike_are_folded_into_one_exactly():
    model = TextModel(VOCAB_A.pieces, VOCAB_A.end_tokens, seed=5)
    folded_some = False
    for s in all_strings(alphabet_of(VOCAB_A), 4):
        exact = view_after(model, s)
        if not exact.paths:
            continue
        # a threshold no path's mass falls below here: only folding differs from exact
        folding = view_after(model, s, prune=1e-12)
        assert folding.dropped == 0
        np.testing.assert_allclose(folding.distribution(), exact.distribution(), rtol=0, atol=1e-12, err_msg=repr(s))
        assert folding.rows <= exact.rows and len(folding.paths) <= len(exact.paths)
        folded_some |= folding.folded > 0 and folding.rows < exact.rows
    assert folded_some  # rows were saved somewhere, not just nothing to fold


def test_folding_moves_a_byte_distribution_by_at_most_prune_per_path_folded():
    prune = 0.4
    folds = 0
    for s in all_strings(alphabet_of(VOCAB_A), 4):
        view = ByteView(ByteVocab(VOCAB_A.pieces, VOCAB_A.end_tokens), max_paths=10**6, prune=prune)
        view.start(VOCAB_A.logits(PROMPT))
        try:
            for b in s:
                for path in view.advance(b).new:
                    view.set_row(path, VOCAB_A.logits(PROMPT + path.tokens))
                before = view.distribution()
                folded = view.settle()
                after = view.distribution()
                assert 0.5 * np.abs(after - before).sum() <= prune * len(folded) + 1e-12, repr(s)
                assert (after == before).all() or folded
                folds += len(folded)
        except Unreachable:  # pruning at 0.4 drops paths some strings need
            continue
    assert folds > 0
    # with prune 0 nothing is folded: the exact view
    assert view_after(VOCAB_A, b"ababa").folded == 0


def test_a_byte_of_probability_zero_is_refused():
    view = view_after(VOCAB_A, b"")
    with pytest.raises(ValueError, match="probability 0"):
        view.advance(ord("z"))


def test_a_model_without_an_end_token_and_a_bad_prune_value_are_refused():
    with pytest.raises(ConfigError, match="no end-of-generation token"):
        ByteVocab((b"a", b"b"), ())
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ConfigError):
            check_prune(bad)
    assert check_prune(0.0) == 0.0


def test_end_symbol_only_where_a_path_ends_exactly():
    # after a lone lead byte of 'é' no path of A ends at a boundary with an end token possible
    # unless a token ends there: A has the token b'\xc3', so END has mass; B too
    for model in (VOCAB_A, VOCAB_B):
        brute = BruteForce(model, PROMPT)
        got = view_after(model, b"\xc3").distribution()
        assert got[END] == pytest.approx(brute.ends(b"\xc3") / brute.prefix(b"\xc3"), abs=1e-12)


# --- sampling through the byte-level generation -----------------------------------------------




LENGTH = 3  # characters per sampled string


def sample_outcomes(models, combiner, n: int, seed: int, temperature: float = 1.0, **method) -> Counter:
    members = [FakeMember(m) for m in models]
    bound = combiner.bind(len(models), [1, 2])
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    for _ in range(n):
        gen = ByteGeneration(members, [PROMPT] * len(models), bound, Sampler(temperature=temperature), rng, max_chars=LENGTH, **method)
        c = run_to_end(gen)
        counts[(c.data, c.finish_reason == "stop")] += 1
    return counts


def check_against(counts: Counter, exact: dict, what: str) -> None:
    keys = sorted(exact)
    assert abs(sum(exact.values()) - 1) < 1e-9
    index = {k: i for i, k in enumerate(keys)}
    unknown = [k for k in counts if k not in index]
    assert not unknown, f"{what}: outcomes of probability 0: {unknown[:3]}"
    assert_matches(Counter({index[k]: c for k, c in counts.items()}), np.array([exact[k] for k in keys]), what)


def test_one_model_through_the_byte_path_samples_its_own_string_distribution():
    brute = BruteForce(VOCAB_A, PROMPT)
    exact = string_distribution(brute.next_symbol, LENGTH, alphabet_of(VOCAB_A))
    check_against(sample_outcomes([VOCAB_A], WeightedEnsemble(), 4000, seed=33), exact, "model A alone")


def _r_we(brutes):
    return lambda s: sum(0.5 * b.next_symbol(s) for b in brutes)


def _r_cd(expert, amateur, mu):
    def r(s):
        pe, pa = expert.next_symbol(s), amateur.next_symbol(s)
        allowed = (pe > 0) | (pa > 0)  # a symbol one rules out and the other allows: RULED_OUT
        pe, pa = (np.where(allowed & (p == 0), RULED_OUT, p) for p in (pe, pa))
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.log(pe) - mu * np.log(pa)
        z[pe == 0] = -np.inf
        p = np.exp(z - z[np.isfinite(z)].max())
        return p / p.sum()
    return r


def _r_gated(lead, inner, gate):
    """The lead's own distribution where its top symbol has at least `gate`, `inner` elsewhere;
    checks that both happen within the strings sampled."""
    seen = set()

    def r(s):
        p = lead.next_symbol(s)
        shut = p.max() >= gate
        seen.add(shut)
        return p if shut else inner(s)

    return r, seen


GATE = 0.75  # opens at some of the strings' positions, not all


@pytest.mark.parametrize(
    "kind,method,gamma",
    [("we", "ensemble", 0), ("cd", "ensemble", 0), ("we", "cos", 2), ("we", "cos", 5), ("cd", "cos", 3), ("cd-gated", "ensemble", 0),
     ("cd-gated", "cos", 3)],
)
@pytest.mark.slow
def test_two_tokenizers_combined_sample_r_exactly(kind, method, gamma):
    """The ensemble, and speculation across the tokenizers (cos: drafts of `gamma` bytes); gated,
    the amateur is a lazy member of the ensemble (asked only where the gate opens)."""
    brutes = [BruteForce(VOCAB_A, PROMPT), BruteForce(VOCAB_B, PROMPT)]
    seen = {True, False}
    if kind == "we":
        combiner, r = WeightedEnsemble(), _r_we(brutes)
    elif kind == "cd":
        combiner, r = Contrastive(mu=0.5, expert=1), _r_cd(brutes[1], brutes[0], 0.5)
    else:
        combiner = Gated(Contrastive(mu=0.5, expert=1), GATE)
        r, seen = _r_gated(brutes[1], _r_cd(brutes[1], brutes[0], 0.5), GATE)
    exact = string_distribution(r, LENGTH, alphabet_of(VOCAB_A, VOCAB_B))
    assert seen == {True, False}
    options = {"method": "cos", "gamma": gamma} if method == "cos" else {}
    counts = sample_outcomes([VOCAB_A, VOCAB_B], combiner, 4000, seed=34 + gamma, **options)
    check_against(counts, exact, f"{kind} of A and B, {method} {gamma or ''}")


def test_greedy_byte_ensemble_takes_the_argmax_of_r_every_byte():
    brutes = [BruteForce(VOCAB_A, PROMPT), BruteForce(VOCAB_B, PROMPT)]
    r = _r_we(brutes)
    (out,) = sample_outcomes([VOCAB_A, VOCAB_B], WeightedEnsemble(), 1, seed=1, temperature=0)
    data, ended = out
    s = b""
    for b in data:
        assert int(np.argmax(r(s))) == b
        s += bytes([b])
    if ended:
        assert int(np.argmax(r(s))) == END


# --- text: one assembly for both levels ----------------------------------------------------------


@pytest.mark.parametrize("method", ["ensemble", "cos"])
def test_the_byte_level_assembles_its_text_as_the_token_level_does(method):
    """The same bytes with a stop string give the text and finish reason the token level's
    `TextAssembler` gives them, streamed in pieces that are never taken back."""
    from localcos.core.text import TextAssembler

    bound = WeightedEnsemble().bind(2, [1, 2])

    def generate(stop=()):
        members = [FakeMember(m, max_paths=4, prune=0.01) for m in (VOCAB_A, VOCAB_B)]
        gen = ByteGeneration(members, [PROMPT] * 2, bound, Sampler(temperature=1.0), np.random.default_rng(9), max_chars=60,
                             method=method, gamma=4, ignore_end=True, stop=stop)  # fmt: skip
        pieces = list(gen.run())
        return gen.completion, pieces

    free, _ = generate()
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 2]
    stopped, pieces = generate(stop=(stop, "no such text"))
    assembler = TextAssembler(lambda b: bytes((b,)), (stop, "no such text"))
    ended = any(assembler.push(b) for b in stopped.data)
    assembler.finish()
    assert ended and stopped.finish_reason == "stop" and stopped.text == assembler.text == free.text[: free.text.index(stop)]
    assert "".join(pieces) == stopped.text and stopped.stats.chars == len(stopped.text)


# --- speculation across tokenizers (cos at the byte level) --------------------------------------


def test_byte_level_cos_drafts_are_judged_and_rows_come_from_one_call():
    members = [FakeMember(m, max_paths=4, prune=0.01) for m in (VOCAB_A, VOCAB_B)]
    bound = WeightedEnsemble().bind(2, [1, 2])
    gen = ByteGeneration(members, [PROMPT] * 2, bound, Sampler(temperature=1.0), np.random.default_rng(5), max_chars=60, method="cos", gamma=6, ignore_end=True)
    c = run_to_end(gen)
    assert c.stats.chars == 60
    assert c.stats.method == "cos"
    assert c.stats.drafted > 0 and 0 < c.stats.accepted <= c.stats.drafted
    # the lattice evaluated ahead most of what the replays asked for
    rows = sum(m.view.rows for m in members)
    assert sum(m.missed for m in members) < rows / 2


@pytest.mark.parametrize("seed,paths", [(1, None), (2, None), (3, 4), (4, 4)])
def test_greedy_byte_level_cos_equals_the_greedy_byte_level_ensemble(seed, paths):
    prompt = (0, seed)
    outs = {}
    for method in ("ensemble", "cos"):
        pruning = {"max_paths": paths, "prune": 0.01} if paths else {}
        members = [FakeMember(VOCAB_A, **pruning), FakeMember(VOCAB_B, **pruning)]
        bound = WeightedEnsemble().bind(2, [1, 2])
        gen = ByteGeneration(members, [prompt] * 2, bound, Sampler(temperature=0), np.random.default_rng(0), max_chars=40 if paths else 12,
                             method=method, gamma=4, ignore_end=bool(paths))  # fmt: skip
        outs[method] = run_to_end(gen).data
    assert outs["cos"] == outs["ensemble"]
    assert len(outs["cos"]) > 0


# --- one generation at a time: the byte level's scheduler, as the server drives it ------------------


class _FakeByteModels:
    """`ByteModels`' face for the scheduler, over fake members (its `start` builds a generation
    as `ByteModels.start` does, with the members of this test)."""

    names = ["A", "B"]

    def __init__(self) -> None:
        # pruned: unpruned, these ambiguous vocabularies hold exponentially many paths
        self.members = [FakeMember(VOCAB_A, max_paths=4, prune=0.01), FakeMember(VOCAB_B, max_paths=4, prune=0.01)]
        self.started: list[str] = []

    def start(self, plan, rng, cancelled=None):
        self.started.append(plan.method)
        config = plan.config
        return ByteGeneration(self.members, plan.prompts, plan.combiner, config.sampler(), rng, max_chars=config.max_tokens,
                              ignore_end=True, method=plan.method, cancelled=cancelled, names=self.names)  # fmt: skip

    def cancelled_completion(self, plan):
        return Completion("", "cancelled", GenerationStats("ensemble", "", [], finish_reason="cancelled"), data=b"")


def test_the_byte_scheduler_runs_one_generation_at_a_time_streams_it_and_stops_a_cancelled_one():
    from localcos.config.specs import GenerationConfig
    from localcos.runtime.bytelevel import BytePlan
    from localcos.runtime.bytescheduler import ByteScheduler

    models = _FakeByteModels()
    bound = WeightedEnsemble().bind(2, [1, 2])
    plan = BytePlan((PROMPT, PROMPT), GenerationConfig(max_tokens=30, temperature=1.0), bound, "ensemble")
    scheduler = ByteScheduler(models)  # type: ignore[arg-type]
    pieces: list[str] = []
    first = scheduler.submit(plan, np.random.default_rng(1), on_chunk=lambda chunk: pieces.append(chunk.text))
    second = scheduler.submit(plan, np.random.default_rng(2))
    waiting = scheduler.submit(plan, np.random.default_rng(3))
    waiting.cancel()  # before it starts: it never does
    scheduler.step()
    assert scheduler.live == [first] and len(models.started) == 1  # one at a time, in arrival order
    done = []
    for _ in range(200):
        done += scheduler.step()
        if first in done:
            break
    assert first.completion.text == "".join(pieces) and len(first.completion.text) == 30  # streamed piece by piece
    scheduler.step()
    assert scheduler.live == [second]
    second.cancel()
    done = scheduler.run()
    assert second.completion.finish_reason == "cancelled" and len(second.completion.text) < 30
    assert waiting.completion.finish_reason == "cancelled" and waiting.completion.text == ""
    assert len(models.started) == 2 and scheduler.idle
    # the same generation alone draws the same text: the scheduler changes nothing it samples
    alone = run_to_end(_FakeByteModels().start(plan, np.random.default_rng(1)))
    assert alone.text == first.completion.text


# --- structured output at the byte level ------------------------------------------------------------
# A finite language, so the constrained r can be computed by brute force without llguidance: a
# symbol is allowed where the text stays a prefix of a word, END where it is a word.
WORDS = [w.encode() for w in ("a", "b", "aé", "bé", "aba", "bba")]
GRAMMAR = 'root ::= ("a" | "b") ("é" | "ba")?'


def _allowed_by_words(s: bytes) -> np.ndarray:
    allowed = np.zeros(END + 1, dtype=bool)
    for w in WORDS:
        if w.startswith(s) and len(w) > len(s):
            allowed[w[len(s)]] = True
    allowed[END] = s in WORDS
    return allowed


@pytest.mark.slow
@pytest.mark.parametrize("method,gamma", [("ensemble", 0), ("cos", 3)])
def test_a_grammar_constrains_the_bytes_and_cos_samples_the_constrained_r_exactly(method, gamma):
    from localcos.grammar import Matcher, byte_symbols, gbnf

    brutes = [BruteForce(VOCAB_A, PROMPT), BruteForce(VOCAB_B, PROMPT)]
    r = _r_we(brutes)

    def constrained(s: bytes) -> np.ndarray:
        p = r(s) * _allowed_by_words(s)
        return p / p.sum()

    exact = string_distribution(constrained, LENGTH, alphabet_of(VOCAB_A, VOCAB_B))
    members = [FakeMember(VOCAB_A), FakeMember(VOCAB_B)]
    bound = WeightedEnsemble().bind(2, [1, 2])
    rng = np.random.default_rng(71 + gamma)
    grammar = gbnf(GRAMMAR)
    counts: Counter = Counter()
    for _ in range(3000):
        options = {"method": "cos", "gamma": gamma} if method == "cos" else {}
        gen = ByteGeneration(members, [PROMPT] * 2, bound, Sampler(temperature=1.0), rng, max_chars=LENGTH,
                             constraint=Matcher(byte_symbols(), grammar), **options)  # fmt: skip
        c = run_to_end(gen)
        counts[(c.data, c.finish_reason == "stop")] += 1
    assert all(data in WORDS for data, _ in counts)
    check_against(counts, exact, f"we of A and B under a grammar, {method} {gamma or ''}")


# --- --byte-gamma auto: drafts planned from call costs ---------------------------------------------

# a small model and one 30 times dearer; on an accelerator a call's rows cost nothing more, on a
# compute-bound CPU k rows cost k calls
FLAT = [CallProfile({1: 0.001}), CallProfile({1: 0.03})]
LINEAR = [CallProfile({1: 0.001, 2: 0.002, 4: 0.004, 8: 0.008}), CallProfile({1: 0.03, 2: 0.06, 4: 0.12, 8: 0.24})]


@pytest.mark.parametrize("profiles, drafts", [(FLAT, True), (LINEAR, False)], ids=["flat", "linear"])
def test_auto_drafts_where_rows_are_cheap_and_takes_the_ensemble_step_where_they_are_not(profiles, drafts):
    auto = ByteAutoGamma(Costs(profiles), rechoose_every=1)
    for _ in range(40):  # an ensemble whose models call once per 3 bytes, one row a call, and agree 95% of the time
        # (the estimate keeps its prior of 8 verdicts at 0.7: it reads about 0.9 here)
        for i in range(2):
            auto.observe_advance(i, 3, 1, 1)
            auto.observe_verdicts(i, 0.95, 0.05)
    proposer, gamma = auto.choose()
    assert (gamma > 0) == drafts, (proposer, gamma)
    if drafts:
        assert proposer == 0  # the small model drafts, the dear one scores
    # models that never agree: nothing pays, whatever the costs
    for _ in range(200):
        for i in range(2):
            auto.observe_verdicts(i, 0.0, 1.0)
    assert auto.choose()[1] == 0


@pytest.mark.slow
def test_cos_with_a_plan_that_changes_every_round_samples_r_exactly(monkeypatch):
    """Auto's choices (who drafts, how many bytes, or no draft) depend only on what came before,
    so r stays exact; here the plan cycles through proposers, lengths and ensemble steps."""
    plans = [(0, 3), (1, 0), (1, 2), (0, 1), (0, 0), (1, 4)]
    turn = iter(range(10**9))
    def choose(self, proposers=None):  # type: ignore[no-untyped-def]
        planned = plans[next(turn) % len(plans)]
        return (planned[0] if proposers is None else proposers[0], planned[1])

    monkeypatch.setattr(ByteAutoGamma, "choose", choose)
    brutes = [BruteForce(VOCAB_A, PROMPT), BruteForce(VOCAB_B, PROMPT)]
    exact = string_distribution(_r_we(brutes), LENGTH, alphabet_of(VOCAB_A, VOCAB_B))
    members = [FakeMember(m) for m in (VOCAB_A, VOCAB_B)]
    bound = WeightedEnsemble().bind(2, [1, 2])
    rng = np.random.default_rng(91)
    counts: Counter = Counter()
    drafted = steps = 0
    for _ in range(3000):
        gen = ByteGeneration(members, [PROMPT] * 2, bound, Sampler(temperature=1.0), rng, max_chars=LENGTH, method="cos", gamma="auto",
                             costs=Costs(FLAT))  # fmt: skip
        c = run_to_end(gen)
        counts[(c.data, c.finish_reason == "stop")] += 1
        drafted += c.stats.drafted
        steps += c.stats.ensemble_steps
    assert drafted > 3000 and steps > 1000
    check_against(counts, exact, "we of A and B, cos with a changing plan")


@pytest.mark.parametrize("profile", [FLAT, LINEAR], ids=["flat", "linear"])
def test_greedy_auto_gives_the_greedy_ensembles_text(profile):
    outs = {}
    for method, gamma in (("ensemble", 8), ("cos", "auto")):
        members = [FakeMember(VOCAB_A, max_paths=4, prune=0.01), FakeMember(VOCAB_B, max_paths=4, prune=0.01)]
        gen = ByteGeneration(members, [(0, 7)] * 2, WeightedEnsemble().bind(2, [1, 2]), Sampler(temperature=0), np.random.default_rng(0),
                             max_chars=40, method=method, gamma=gamma, costs=Costs(profile), ignore_end=True)  # fmt: skip
        c = run_to_end(gen)
        outs[method] = c.data
        if method == "cos" and profile is LINEAR:
            assert c.stats.drafted == 0 and c.stats.ensemble_steps > 0
    assert outs["cos"] == outs["ensemble"] and len(outs["ensemble"]) >= 40


def test_auto_stops_drafting_when_drafted_rounds_cost_more_than_it_planned():
    auto = ByteAutoGamma(Costs(FLAT), rechoose_every=1)
    for _ in range(40):
        for i in range(2):
            auto.observe_advance(i, 3, 1, 1)
            auto.observe_verdicts(i, 0.95, 0.05)
    proposer, gamma = auto.choose()
    assert gamma > 0
    for _ in range(6):  # its rounds cost five times what it planned (work the estimate leaves out)
        planned = auto.round_seconds(proposer, gamma)
        auto.observe_round(proposer, planned, 5 * planned)
    assert auto.choose()[1] == 0


def test_a_restart_replays_its_token_however_lightly_the_model_weighs_it():
    # the restart's own token 'xy' is far lighter than 'x', and no other token holds 'y': pruned
    # to one path, the replay followed 'x' and found nothing for 'y' (Unreachable, uncaught)
    model = TinyModel((b"x", b"xy", b"z", b""), end_tokens=(3,), seed=0)
    probs = model.probs(PROMPT)
    assert probs[0] > 10 * probs[1]
    view = ByteView(ByteVocab(model.pieces, model.end_tokens), max_paths=1, prune=0.01)
    view.restart((), 0, model.logits(PROMPT))
    for b in b"xy":
        for path in view.advance(b, force=True).new:
            view.set_row(path, model.logits(PROMPT + path.tokens))
        view.settle()
    assert bytes(view.text) == b"xy" and [p.tokens for p in view.paths] == [(1,)]
    # a byte no path can produce is still refused without force
    with pytest.raises(Unreachable):
        view.advance(ord("y"))
