"""The token level's scorer: log-probabilities of a token sequence under an ensemble's r and its
members (the byte level's: `runtime.bytelevel.scoring`).

Every model evaluates the tokens in llama_decode calls of up to `n_batch` tokens (never one call
per token), each keeping what its KV cache already holds of them (a shared context is evaluated
once; a different continuation after it costs its own tokens only, rolled back with `seq_rm`).
llama.cpp's logits of a call are read in place, a slice of rows at a time, and go through the same
combination code decoding uses (`core.logprobs`), so host memory stays bounded by the slice, not
the text. `Ensemble.score`, `Ensemble.loglikelihood`, `localcos score` (`localcos.scoring`) and the server's
``echo`` + ``logprobs`` all come here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..backend import common_prefix
from ..core.combiners import BoundCombiner, Combiner
from ..core.logprobs import Scratch, score_rows
from ..config.specs import required_second_prompt
from .plan import check_token_ids
from ..errors import Cancelled, ConfigError, PromptTooLongError, param_of

if TYPE_CHECKING:
    from .loaded import LoadedModels

SLICE_ROWS = 8  # logits rows combined at a time: a few rows x vocabulary stay in the CPU cache
# Rows one llama_decode call returns when scoring (`Ensemble.load(max_logit_rows=...)`): llama.cpp
# keeps an output buffer of this many vocabulary rows per model (78 MiB at 152k), so it is not
# n_batch; a window's unscored first half still goes in calls of n_batch tokens.
SCORING_LOGIT_ROWS = 128


@dataclass
class Scores:
    """Log-probabilities (natural log, temperature 1) of `tokens[i]`, each given all tokens
    before it in the scored sequence."""

    tokens: list[int]
    combined: list[np.ndarray]  # per combiner: log r(token)
    greedy: list[np.ndarray]  # per combiner: the token was r's most likely one
    members: np.ndarray | None  # [n_models, n]: log p_i(token) under each model alone
    top: list[list[tuple[int, float]]] | None = None  # per token: r's most likely tokens there
    evaluated: list[int] = field(default_factory=list)  # tokens each model evaluated for this

    @property
    def logprobs(self) -> np.ndarray:
        """log r(token) under the (first) combiner."""
        return self.combined[0]


@dataclass(frozen=True)
class _Scored:
    tokens: tuple[int, ...]
    start: int  # scores cover positions start .. len(tokens) - 1
    logprobs: np.ndarray
    greedy: np.ndarray
    top: list[list[tuple[int, float]]]


class ScoreCache:
    """What earlier scorings under r computed, for later ones that share a prefix with them (an
    evaluation harness's choices after one context, each sent as its own request): position p's
    score depends only on the tokens up to p, so those of a shared prefix are taken from here and
    only the rest is evaluated. Bounded: at most `max_positions` positions in all, the least
    recently used go first. For scoring under one combiner without the members (a server's)."""

    def __init__(self, max_positions: int = 1 << 16) -> None:
        self.max_positions = max_positions
        self._entries: OrderedDict[tuple, _Scored] = OrderedDict()
        self.reused = 0  # positions taken from here (for statistics)

    def _size(self) -> int:
        return sum(len(e.tokens) - e.start for e in self._entries.values())

    def lookup(self, kind: tuple, tokens: Sequence[int], start: int) -> tuple[int, _Scored] | None:
        """(k, entry): positions start .. k - 1 of `tokens` are scored in `entry` (k > start)."""
        best: tuple[int, _Scored] | None = None
        for key, entry in self._entries.items():
            if key[0] != kind or entry.start > start:
                continue
            k = common_prefix(entry.tokens, tokens)  # position p < k saw the same tokens
            if k > start and (best is None or k > best[0]):
                best = (k, entry)
        if best is not None:
            self._entries.move_to_end((kind, best[1].tokens, best[1].start))
        return best

    def store(self, kind: tuple, tokens: Sequence[int], start: int, scores: Scores) -> None:
        key = (kind, tuple(tokens), start)
        self._entries[key] = _Scored(key[1], start, scores.logprobs, scores.greedy[0], list(scores.top or []))
        self._entries.move_to_end(key)
        while len(self._entries) > 1 and self._size() > self.max_positions:
            self._entries.popitem(last=False)


def score_tokens(
    loaded: LoadedModels,
    tokens: Sequence[int],
    start: int = 1,
    *,
    combiners: Sequence[Combiner | BoundCombiner] | None = None,
    members: bool = True,
    top: int = 0,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    slot: int = 0,
    reuse: ScoreCache | None = None,
    second: tuple[Sequence[int], int] | None = None,
) -> Scores:
    """Scores of tokens[start:], each given the tokens before it (start >= 1).

    `combiners` (default: the ensemble's) are scored on the same rows, so a sweep over weights or
    mu costs the models nothing more. `members` adds each model's own log-probabilities; `top`
    the `top` most likely tokens of r at each scored position. When `cancelled()` turns true
    between two llama_decode calls, `Cancelled` is raised (every cache holds what it evaluated).
    The models evaluate in their slot `slot` (a server scores in a slot of its own). With `reuse`
    (one combiner, no members), the scores of a prefix scored before are taken from it and only
    the rest is evaluated; what is scored is added to it.

    Where the models have a second prompt's member (`LoadedModels.second_member`), `second` =
    (its prompt, k): it reads its prompt in place of tokens[:k] (k <= start: a text's document
    start, or a context), so each scored token is given its prompt and the tokens after k before
    it. Its rows go in the lead's calls (one model, one call), each call's tokens split between
    the two.
    """
    if reuse is not None:
        return _score_reusing(loaded, tokens, start, combiners, top, progress, cancelled, slot, reuse)
    tokens = _checked(loaded, tokens, start, second)
    n = len(tokens)
    bound = [loaded.bind(c) for c in combiners] if combiners is not None else [loaded.combiner]
    n_models = len(loaded.models)
    needed = [members or any(c.used[i] for c in bound) for i in range(n_models)]
    slots = [member[slot] for member in loaded.member_slots]
    # each member's sequence, and where it stands against `tokens` (its position of token p: p + shift)
    sequences, shifts = [tokens] * n_models, [0] * n_models
    if second is not None and loaded.second_member is not None:
        prompt, k = second
        sequences[loaded.second_member], shifts[loaded.second_member] = [*prompt, *tokens[k:]], len(prompt) - k
    used = [i for i in range(n_models) if needed[i]]

    # every needed member resumes from what it shares with its sequence up to the row at position
    # start - 1 (which predicts tokens[start]: it must come from this evaluation); a member reading
    # a second prompt first takes its prompt, and what it holds of it is kept
    keep = min((min(common_prefix(slots[i].tokens, tokens), start - 1) for i in used if not shifts[i]), default=start - 1)
    for i in used:
        upto = keep if not shifts[i] else start - 1 + shifts[i]
        slots[i].truncate(min(common_prefix(slots[i].tokens, sequences[i]), upto))
        if len(slots[i].tokens) < upto:
            slots[i].evaluate(sequences[i][len(slots[i].tokens) : upto], 0)
    evaluated = [len(s.tokens) for s in slots]
    # the members of one model share its calls: each call's tokens and rows split between them
    per_model: dict[int, list[int]] = {}
    for i in used:
        per_model.setdefault(id(loaded.models[i]), []).append(i)
    share = max(len(group) for group in per_model.values())

    combined: list[list[np.ndarray]] = [[] for _ in bound]
    greedy: list[list[np.ndarray]] = [[] for _ in bound]
    member_parts: list[np.ndarray] = []
    top_rows: list[list[tuple[int, float]]] = []
    scratch = Scratch()
    n_batch = min(loaded.models[i].n_batch for i in used) // share
    max_rows = min(loaded.models[i].max_logit_rows for i in used) // share
    for lo, hi, first, end in _calls(n, start, keep, n_batch, max_rows):
        if cancelled is not None and cancelled():
            raise Cancelled(f"scoring cancelled after {lo} of {n} tokens")
        views: list[np.ndarray | None] = [None] * n_models
        for group in per_model.values():
            # a second prompt's member holds its sequence up to the row at position start - 1: it
            # takes the call's tokens from there
            taking = [i for i in group if not shifts[i] or hi > start - 1]
            skips = [max(start - 1 - lo, 0) if shifts[i] else 0 for i in taking]
            parts = [(slots[i], sequences[i][lo + skip + shifts[i] : hi + shifts[i]], first - skip, end - skip) for i, skip in zip(taking, skips)]
            for i, rows in zip(taking, loaded.models[group[0]].decode(parts) if parts else []):
                views[i] = rows
        for s in range(0, end - first, SLICE_ROWS):
            e = min(end - first, s + SLICE_ROWS)
            targets = np.asarray(tokens[lo + first + s + 1 : lo + first + e + 1])
            part = score_rows([v[s:e] if v is not None else None for v in views], targets, bound, members=members, top=top, scratch=scratch)
            for c in range(len(bound)):
                combined[c].append(part.combined[c])
                greedy[c].append(part.greedy[c])
            if part.members is not None:
                member_parts.append(part.members)
            if part.top is not None:
                top_rows.extend(part.top)
        if progress:
            progress(hi, n)
    return Scores(
        tokens=tokens[start:],
        combined=[np.concatenate(x) if x else np.zeros(0) for x in combined],
        greedy=[np.concatenate(x) if x else np.zeros(0, bool) for x in greedy],
        members=np.concatenate(member_parts, axis=1) if member_parts else (np.zeros((n_models, 0)) if members else None),
        top=top_rows if top > 0 else None,
        evaluated=[len(s.tokens) - e for s, e in zip(slots, evaluated)],
    )


def _checked(loaded: LoadedModels, tokens: Sequence[int], start: int, second: tuple[Sequence[int], int] | None) -> list[int]:
    """The tokens to score, as ints, once they are known to fit: something to score from `start`
    (>= 1), within the context, every id in the vocabulary; a second prompt for the second
    prompt's member where the models have one (and only there), read in place of tokens[:k],
    k <= start, its sequence within the context too."""
    tokens = [int(t) for t in tokens]
    n = len(tokens)
    if not 1 <= start <= n:
        raise ConfigError(f"nothing to score: {n} tokens, scoring from token {start}", param="prompt")
    if n > loaded.n_ctx:
        raise PromptTooLongError(f"{n} tokens do not fit the context of {loaded.n_ctx}; raise --ctx or score a shorter text")
    check_token_ids(loaded, tokens)
    if loaded.second_member is not None:
        required_second_prompt(None if second is None else second[0])
    elif second is not None:
        raise ConfigError("a second prompt needs models loaded with a member for it (--negative-prompt)", param="negative_prompt")
    if second is not None:
        prompt, k = second
        if not prompt or not 0 <= k <= start:
            raise ConfigError(f"a second prompt of {len(prompt)} tokens in place of the first {k} of {n}, scoring from {start}", param="negative_prompt")
        check_token_ids(loaded, prompt, "negative_prompt")
        if len(prompt) + n - k > loaded.n_ctx:
            raise PromptTooLongError(f"the second prompt and the text ({len(prompt) + n - k} tokens) do not fit the context of {loaded.n_ctx}",
                                     param="negative_prompt")  # fmt: skip
    return tokens


def _calls(n: int, start: int, keep: int, n_batch: int, max_rows: int) -> Iterator[tuple[int, int, int, int]]:
    """The calls that score n tokens from `start`, the first `keep` in the caches already: (lo,
    hi, first, end), tokens[lo:hi] evaluated and the rows [first, end) of them returned. Rows at
    positions p in [start - 1, n - 2] score tokens[p + 1]; the last token is evaluated too
    (without a row), so each cache ends holding the whole sequence. A call takes up to n_batch
    tokens and ends early after max_rows rows (llama.cpp's output buffer holds no more)."""
    lo = keep
    while lo < n:
        hi = min(n, lo + n_batch)
        first, end = max(start - 1, lo) - lo, max(min(n - 1, hi), lo) - lo
        first = min(first, end)
        if end - first > max_rows:
            end = first + max_rows
            hi = lo + end
        yield lo, hi, first, end
        lo = hi


def _score_reusing(
    loaded: LoadedModels,
    tokens: Sequence[int],
    start: int,
    combiners: Sequence[Combiner | BoundCombiner] | None,
    top: int,
    progress: Callable[[int, int], None] | None,
    cancelled: Callable[[], bool] | None,
    slot: int,
    reuse: ScoreCache,
) -> Scores:
    """`score_tokens` of one combiner without members, through a `ScoreCache`."""
    tokens = [int(t) for t in tokens]
    combiner = loaded.bind(combiners[0]) if combiners else loaded.combiner
    kind = (combiner.description, top)
    hit = reuse.lookup(kind, tokens, start)
    if hit is None:
        scores = score_tokens(loaded, tokens, start, combiners=[combiner], members=False, top=top, progress=progress, cancelled=cancelled, slot=slot)
    else:
        k, entry = hit
        k = min(k, len(tokens))
        lo, hi = start - entry.start, k - entry.start
        head = Scores(tokens[start:k], [entry.logprobs[lo:hi]], [entry.greedy[lo:hi]], None, entry.top[lo:hi] if top > 0 else None)
        reuse.reused += k - start
        if k == len(tokens):
            scores = head
        else:
            tail = score_tokens(loaded, tokens, k, combiners=[combiner], members=False, top=top, progress=progress, cancelled=cancelled, slot=slot)
            scores = Scores(
                tokens[start:],
                [np.concatenate([head.combined[0], tail.combined[0]])],
                [np.concatenate([head.greedy[0], tail.greedy[0]])],
                None,
                (head.top or []) + (tail.top or []) if top > 0 else None,
                tail.evaluated,
            )
    reuse.store(kind, tokens, start, scores)
    return scores


@dataclass(frozen=True)
class Loglikelihood:
    """How likely a continuation is after a context: summed and per token, under r (the
    ensemble's combination) and under each model alone."""

    tokens: int
    logprob: float  # sum of log r over the continuation's tokens
    greedy: bool  # every token was r's most likely one
    members: tuple[float, ...]  # sum of log p_i per model

    @property
    def per_token(self) -> float:
        return self.logprob / self.tokens


def continuation_scores(
    loaded: LoadedModels,
    context: str | Sequence[int],
    continuations: Sequence[str | Sequence[int]],
    combiners: Sequence[Combiner | BoundCombiner] | None = None,
    what: str = "continuation",
    second_prompt: str | Sequence[int] | None = None,
) -> list[Scores]:
    """Scores of each continuation's tokens after `context` (each model's cache keeps the context,
    so it is evaluated once and each continuation after it). Text continues text as the whole
    tokenises: a continuation is what tokenize(context + continuation) adds after
    tokenize(context), or, where the two disagree at the seam, its own tokens. A second prompt's
    member reads `second_prompt` in place of the context (as it reads it in place of a prompt)."""
    ctx = loaded.tokenize(context) if isinstance(context, str) else [int(t) for t in context]
    if not ctx:
        raise ConfigError("the context is empty", param="context")
    second_tokens = loaded.tokenize(second_prompt) if isinstance(second_prompt, str) else second_prompt
    out = []
    for i, cont in enumerate(continuations):
        if isinstance(cont, str):
            whole = loaded.tokenize(context + cont) if isinstance(context, str) else []
            seam = whole[: len(ctx)] == ctx and len(whole) > len(ctx)
            toks = whole[len(ctx) :] if seam else loaded.tokenize(cont, add_bos=False)
        else:
            toks = [int(t) for t in cont]
        if not toks:
            raise ConfigError(f"{what} {i} ({cont!r}) tokenises to nothing", param=param_of(what))
        out.append(score_tokens(loaded, ctx + toks, len(ctx), combiners=combiners, members=True,
                                second=None if second_tokens is None else (second_tokens, len(ctx))))
    return out


def loglikelihood(
    loaded: LoadedModels, context: str | Sequence[int], continuations: Sequence[str | Sequence[int]], *, combiner: Combiner | BoundCombiner | None = None,
    second_prompt: str | Sequence[int] | None = None,
) -> list[Loglikelihood]:
    """The log-likelihood of each continuation given the context (the context is evaluated once;
    a second prompt's member reads `second_prompt` in its place)."""
    out = []
    for s in continuation_scores(loaded, context, continuations, None if combiner is None else [combiner], second_prompt=second_prompt):
        assert s.members is not None
        out.append(
            Loglikelihood(len(s.tokens), float(s.logprobs.sum()), bool(s.greedy[0].all()), tuple(float(x) for x in s.members.sum(axis=1)))
        )
    return out
