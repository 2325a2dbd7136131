"""Perplexity of a text for the combined distribution r and for each model alone, over a grid of
combinations if asked (a sweep costs the models nothing more: every combination is scored on the
same rows of logits).

Windows are llama.cpp's `llama-perplexity`'s, so the figures compare: the text is tokenised once
(BOS added as the model says), cut into chunks of `n_ctx` tokens (a tail shorter than a chunk is
dropped), each chunk evaluated from an empty context with its first token replaced by BOS where
the model adds one, and the second half of each chunk scored: the tokens at positions
n_ctx/2 + 1 ... n_ctx - 1, each given everything before it in its chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

import numpy as np

from ..core.combiners import Combiner
from ..errors import ConfigError
from ..runtime.scoring import score_tokens

if TYPE_CHECKING:
    from ..runtime.loaded import LoadedModels


@dataclass
class NLL:
    """Negative log-likelihood sums (for a perplexity and llama-perplexity's error estimate)."""

    total: float = 0.0
    squares: float = 0.0
    count: int = 0

    def add(self, logprobs: np.ndarray) -> None:
        nll = -np.asarray(logprobs, dtype=np.float64)
        self.total += float(nll.sum())
        self.squares += float((nll * nll).sum())
        self.count += len(nll)

    @property
    def perplexity(self) -> float:
        return math.exp(self.total / self.count) if self.count else math.nan

    @property
    def error(self) -> float:
        """llama-perplexity's +/-: perplexity x the standard error of the mean log-likelihood."""
        if self.count < 2:
            return math.nan
        mean = self.total / self.count
        var = self.squares / self.count - mean * mean
        return math.sqrt(max(var, 0.0) / (self.count - 1)) * self.perplexity


@dataclass
class PerplexityResult:
    """Perplexity of a text under each combination and each model alone."""

    combined: list[NLL]  # one per combiner
    members: list[NLL]
    windows: int
    n_ctx: int
    tokens: int  # tokens in the text


def windows(tokens: Sequence[int], n_ctx: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: consecutive n_ctx tokens, the first one replaced by `bos`."""
    if n_ctx < 4:
        raise ConfigError(f"--ctx must be at least 4 tokens to make perplexity windows, got {n_ctx}", param="ctx")
    if len(tokens) < 2 * n_ctx:
        raise ConfigError(
            f"the text has {len(tokens)} tokens; perplexity with --ctx {n_ctx} needs at least {2 * n_ctx} "
            "(two windows): give a longer text or a smaller --ctx",
            param="text",
        )
    out = []
    for i in range(len(tokens) // n_ctx):
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def perplexity(
    ens: LoadedModels,
    text: str,
    combiners: Sequence[Combiner],
    *,
    n_ctx: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    second_prompt: str | None = None,
) -> PerplexityResult:
    """Perplexity of `text` under each of `combiners` and each model, in llama-perplexity's
    windows. Where the models have a second prompt's member, it reads `second_prompt` in place of
    each window's document start (its BOS; before the window where the model adds none), and
    the windows leave room for it (default: the context less the prompt's extra tokens)."""
    if not text.strip():
        raise ConfigError("the text is empty", param="text")
    first = ens.models[0]
    bos = first.bos if first.add_bos and first.bos >= 0 else None
    second = None if second_prompt is None else (ens.tokenize(second_prompt), int(bos is not None))
    room = ens.n_ctx - (len(second[0]) - second[1] if second else 0)
    n_ctx = n_ctx or room
    if n_ctx > room:
        raise ConfigError(f"windows of {n_ctx} tokens do not fit the context of {ens.n_ctx}" + (" beside the second prompt" if second else ""),
                          param="ctx")  # fmt: skip
    tokens = ens.tokenize(text)
    chunks = windows(tokens, n_ctx, bos)
    combined = [NLL() for _ in combiners]
    members = [NLL() for _ in ens.models]
    for w, chunk in enumerate(chunks):
        s = score_tokens(ens, chunk, n_ctx // 2 + 1, combiners=combiners, members=True, second=second)
        for nll, logprobs in zip(combined, s.combined):
            nll.add(logprobs)
        assert s.members is not None
        for nll, logprobs in zip(members, s.members):
            nll.add(logprobs)
        if progress:
            progress(w + 1, len(chunks))
    return PerplexityResult(combined, members, len(chunks), n_ctx, len(tokens))
