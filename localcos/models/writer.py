"""Synthetic GGUF models written with the gguf package: test and demo models that behave like LMs.

No model can be downloaded in CI, so localcos writes its own llama-architecture GGUF files,
deterministically from a seed, in seconds. They are small, but they behave like language models
where it matters for collaborative decoding:

* Peaked next-token distributions. Each token has a few "successor" tokens; the output matrix is
  built so that the logits after token t favour t's successors, over a noise floor that the
  random embeddings create. A single output scale is calibrated (on that bigram part, in NumPy)
  so the mean next-token entropy lands near a target (default 2 nats). Attention heads whose
  value/output maps compose to a scaled identity mix in earlier tokens (their successors gain
  weight), so the distribution depends on the context, not just the last token.
* Families that agree to a chosen degree. A *sibling* is the base model with every weight
  perturbed by scaled noise; a *larger* model is the base plus extra layers whose contributions
  are small, so it predicts nearly what the base predicts but costs several times more per token.
* A real SentencePiece-style ("llama") tokenizer that llama.cpp accepts: byte fallback tokens,
  single characters, merges learned from a built-in English corpus, and more merged pieces up to
  any vocabulary size (about 152k is fine). A tokenizer *variant* permutes the ids, for the
  tokenizer-mismatch error; `pad_vocab_to` appends [PAD] tokens the way padded embedding matrices
  appear in real model families.
* Or any real tokenizer: `ModelSpec(tokenizer=PATH)` copies every ``tokenizer.*`` field of a
  GGUF file verbatim (llama.cpp's vocabulary test files, see `llamacpp_sdist`, or any model), and
  builds the same kind of weights over that vocabulary: Qwen2's byte-level BPE, Llama 3's,
  SentencePiece, with their special tokens, end-of-generation tokens and chat templates.
* The architectures users run: ``llama``, and ``qwen2`` (attention biases). Quantised types
  (Q8_0, Q4_0, Q4_K_M) go through llama.cpp's own quantiser (`llama_model_quantize`), as users'
  files do; F32, F16 and BF16 are written directly.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from collections.abc import Callable

import numpy as np

import gguf

from ..files import CACHE_HINT, atomic_path
from .quantize import quantize
from .weights import WEIGHT_TYPES, WRITTEN_TYPES, file_type

WRITER_VERSION = 6  # bump when the output of the writer changes (invalidates caches)

# GGUF token types (llama.cpp's llama_token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space

_CORPUS = """
The small model writes a draft and the large model checks it. When both agree the draft is kept,
and when they disagree the large model chooses a better word. This is how speculative decoding
saves time: many tokens are checked in one pass instead of one pass for every token.
An ensemble of language models combines what each model believes about the next word. A weighted
ensemble adds their probabilities; contrastive decoding subtracts what a weak model believes from
what a strong model believes, so that the answer keeps what only the strong model knows.
The river runs past the old mill and under the stone bridge. In the morning the fishermen take
their boats out on the water, and in the evening they sell their fish in the market by the harbour.
Children walk to school along the river, and their teachers wait for them at the gate.
A function takes some values, does some work, and returns a result. Good code has clear names,
short functions and tests that show what it does. Write the test first, then the code, then
read it again and make it simpler. Return the list, check the length, and raise an error when
the input is wrong.
There are seven days in a week and twelve months in a year. If a train leaves at nine and
arrives at eleven, the journey takes two hours. Three times four is twelve, and twelve divided
by three is four. The answer is the number of apples that are left in the basket.
The library opens at ten and closes at six. People come to read newspapers, borrow books and
use the computers. On Saturday there is a story hour for young readers, and on Sunday the
library is closed. The city plans to build a new library near the park next year.
Scientists measure the temperature of the ocean every day. They found that the water is warmer
than it was thirty years ago, and that the warm water changes where fish can live. The report
says that the change will continue unless the world uses less coal, oil and gas.
def main(): print("hello world") for item in items: if item is None: continue return total
import numpy as np; x = np.zeros(10); y = x + 1; assert y.sum() == 10
Question: what is the capital of France? Answer: Paris. Question: which planet is red? Answer: Mars.
"""


# --- tokenizer ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocab:
    """A vocabulary and what the weights need to know of it."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    n_real: int  # tokens below this id are real; above are [PAD] tokens
    word_start: str = SPACE  # how a token that starts a word begins: SentencePiece's ▁, byte-level BPE's Ġ
    end_ids: tuple[int, ...] = (2,)  # tokens that end a text (EOS first): each gets its own context
    fields: dict | None = None  # tokenizer.* metadata copied verbatim (None: the synthetic tokenizer)

    @property
    def size(self) -> int:
        return len(self.tokens)


# End-of-text tokens of common families (llama.cpp treats them as end of generation); a real
# vocabulary's weights give each one it has a context that predicts it.
END_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "</s>")


@functools.lru_cache(maxsize=8)
def load_vocab(path: str) -> Vocab:
    """The tokenizer of a GGUF file, with every tokenizer.* field kept for a verbatim copy."""
    from ..backend import read_info

    info = read_info(path, keep=lambda key: key.startswith("tokenizer."))
    fields = info.fields
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError(f"{path} has no tokenizer")
    tokens = [t.decode("utf-8", errors="replace") for t in fields["tokenizer.ggml.tokens"].value]
    types = list(fields["tokenizer.ggml.token_type"].value) if "tokenizer.ggml.token_type" in fields else [TT_NORMAL] * len(tokens)
    scores = list(fields["tokenizer.ggml.scores"].value) if "tokenizer.ggml.scores" in fields else [0.0] * len(tokens)
    model = fields["tokenizer.ggml.model"].value.decode()
    eos = fields["tokenizer.ggml.eos_token_id"].value if "tokenizer.ggml.eos_token_id" in fields else None
    index = {t: i for i, t in enumerate(tokens)}
    ends = ([eos] if eos is not None else []) + [index[t] for t in END_TEXTS if t in index and index[t] != eos]
    return Vocab(tokens, scores, types, len(tokens), "\u0120" if model == "gpt2" else SPACE, tuple(ends), fields)


def _learn_merges(words: Counter[str], n_merges: int) -> list[str]:
    """Byte-pair merges learned on `words` (each starting with the SentencePiece space).

    Pair counts are updated incrementally: a merge only touches the words that contain its pair.
    """
    splits = {w: list(w) for w in words}
    counts: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    for w, c in words.items():
        s = splits[w]
        for pair in zip(s, s[1:]):
            counts[pair] += c
            where[pair].add(w)
    merged: list[str] = []
    for _ in range(n_merges):
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
        new = best[0] + best[1]
        merged.append(new)
        for w in list(where[best]):
            s, c = splits[w], words[w]
            for pair in zip(s, s[1:]):
                counts[pair] -= c
                if counts[pair] <= 0:
                    del counts[pair]
                where[pair].discard(w)
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            splits[w] = out
            for pair in zip(out, out[1:]):
                counts[pair] += c
                where[pair].add(w)
    return merged


@functools.lru_cache(maxsize=8)
def build_vocab(size: int, *, variant: int = 0, pad_to: int | None = None) -> Vocab:
    """A SentencePiece ("llama") vocabulary of `size` real tokens (plus [PAD]s up to `pad_to`).

    Ids 0-2 are <unk>, <s>, </s>; 3-258 the byte-fallback tokens; then characters, learned merges
    and generated merges. `variant` != 0 permutes the ids of the ordinary tokens (a different
    tokenizer for the same text pieces).
    """
    if size < 400:
        raise ValueError("vocabulary size must be at least 400")
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    text = _CORPUS
    chars = sorted(set("".join(chr(c) for c in range(33, 127))) | set(text.replace(" ", "").replace("\n", "")))
    pieces: list[str] = [SPACE] + [c for c in chars if c.isprintable()]
    words = Counter(SPACE + w for w in text.split())
    budget = size - len(specials) - len(byte_tokens) - len(pieces)
    merges = _learn_merges(words, min(budget, 700))
    seen = set(pieces)
    for m in merges:
        if m not in seen:
            seen.add(m)
            pieces.append(m)
    # Fill the rest with pieces made of two existing ones (reachable by one more merge), as large
    # vocabularies hold many rare long pieces.
    rng = np.random.default_rng(12345)
    base = [p for p in pieces if len(p) > 1]
    tails = [p for p in pieces if not p.startswith(SPACE)]
    target = size - len(specials) - len(byte_tokens)
    while len(pieces) < target:
        n = 2 * (target - len(pieces))
        for ia, ib in zip(rng.integers(len(base), size=n).tolist(), rng.integers(len(tails), size=n).tolist()):
            p = base[ia] + tails[ib]
            if len(p) <= 24 and p not in seen:
                seen.add(p)
                pieces.append(p)
                if len(base) < 50000:
                    base.append(p)
                if len(pieces) == target:
                    break
    # earlier pieces count as more frequent: a higher score, merged first
    scores = [-float(i) for i in range(len(pieces))]
    if variant:
        perm = np.random.default_rng(1000 + variant).permutation(len(pieces))
        pieces = [pieces[i] for i in perm]
        scores = [scores[i] for i in perm]
    tokens = specials + byte_tokens + pieces
    all_scores = [0.0, 0.0, 0.0] + [0.0] * 256 + scores
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL] + [TT_BYTE] * 256 + [TT_NORMAL] * len(pieces)
    n_real = len(tokens)
    if pad_to is not None and pad_to > n_real:
        for i in range(n_real, pad_to):
            tokens.append(f"[PAD{i}]")
            all_scores.append(-1e9)
            types.append(TT_UNUSED)
    return Vocab(tokens, all_scores, types, n_real)


# --- weights -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """Everything that determines a synthetic model; equal specs give byte-identical files."""

    vocab_size: int = 2048  # of the synthetic tokenizer (a real `tokenizer` brings its own)
    n_embd: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int | None = None
    n_ff: int = 256
    context_length: int = 4096
    seed: int = 0  # the family: embeddings, successors and base layers
    dtype: str = "f32"  # f32 | f16 | bf16, or through llama.cpp's quantiser: q8_0 | q4_0 | q4_k_m
    entropy: float = 2.0  # target mean next-token entropy in nats
    successors: int = 8
    attn_mix: float = 0.5  # how much attention mixes in earlier tokens
    ffn_scale: float = 0.1
    eos_rate: float = 0.002  # share of tokens that have EOS among their successors
    # family members
    noise: float = 0.0  # sibling: relative noise added to every weight
    noise_seed: int = 1
    extra_layers: int = 0  # larger: layers appended after the base layers
    extra_scale: float = 0.05  # relative size of the extra layers' contributions
    widen: int = 1  # larger: the base embedded in a model this many times as wide
    widen_scale: float = 0.1  # relative size of what the new width contributes
    tokenizer_variant: int = 0
    pad_vocab_to: int | None = None
    tokenizer: str | None = None  # a GGUF file whose tokenizer (every tokenizer.* field) is copied
    arch: str = "llama"  # llama | qwen2 (attention biases)
    chat_template: str | None = None  # overrides the tokenizer's
    # fill-in-the-middle tokens in the synthetic vocabulary (its last six pieces become them):
    # "text", Qwen2.5-Coder's, which llama.cpp finds by their text; "header", tokens of other
    # names that the header's tokenizer.ggml.fim_*_token_id keys name
    fim: str | None = None
    name: str = "localcos-synthetic"

    def key(self) -> str:
        fields = asdict(self)
        if self.tokenizer is not None:  # the file's content, not where it lies
            fields["tokenizer"] = _file_digest(self.tokenizer)
        data = json.dumps({"v": WRITER_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]

    def vocab(self) -> Vocab:
        if self.tokenizer is not None:
            return load_vocab(str(self.tokenizer))
        vocab = build_vocab(self.vocab_size, variant=self.tokenizer_variant, pad_to=self.pad_vocab_to)
        if self.fim is not None:  # a new vocabulary (build_vocab's is shared)
            texts = FIM_TEXTS[self.fim]
            first = vocab.n_real - len(texts)
            vocab = replace(vocab, tokens=[*vocab.tokens[:first], *texts, *vocab.tokens[vocab.n_real :]],
                            types=[*vocab.types[:first], *[TT_CONTROL] * len(texts), *vocab.types[vocab.n_real :]])  # fmt: skip
        return vocab

    def fim_ids(self) -> dict[str, int]:
        """The header's fim_*_token_id keys ("header" only): each FIM token's id."""
        if self.fim != "header":
            return {}
        first = self.vocab_size - len(FIM_TEXTS["header"])
        return {key: first + i for i, key in enumerate(("pre", "suf", "mid", "pad", "rep", "sep"))}


# the FIM tokens a synthetic vocabulary may hold (prefix, suffix, middle, pad, repository, file separator)
FIM_TEXTS = {
    "text": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"),
    "header": ("<hole-before>", "<hole-after>", "<hole-fill>", "<hole-pad>", "<hole-repo>", "<hole-file>"),
}


@functools.lru_cache(maxsize=32)
def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _rmsnorm_rows(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)


def _successor_matrix(E: np.ndarray, succ: np.ndarray, strength: np.ndarray, n_rows: int) -> np.ndarray:
    """W with W[v] = sum over (t, k) with succ[t, k] == v of strength[k] * E[t] / d."""
    n_tok, k = succ.shape
    d = E.shape[1]
    W = np.zeros((n_rows, d), dtype=np.float32)
    chunk = max(1, (1 << 24) // (k * d))  # ~64 MiB of contributions at a time
    for lo in range(0, n_tok, chunk):
        hi = min(n_tok, lo + chunk)
        flat_v = succ[lo:hi].ravel()
        flat_t = np.repeat(np.arange(lo, hi), k)
        flat_c = np.tile(strength, hi - lo)
        order = np.argsort(flat_v, kind="stable")
        flat_v, flat_t, flat_c = flat_v[order], flat_t[order], flat_c[order]
        contrib = E[flat_t] * flat_c[:, None]
        starts = np.flatnonzero(np.r_[True, flat_v[1:] != flat_v[:-1]])
        W[flat_v[starts]] += np.add.reduceat(contrib, starts, axis=0)
    return W / d


def _calibrate_scale(E: np.ndarray, W: np.ndarray, target: float, rng: np.random.Generator) -> float:
    """The output scale g for which the bigram logits g * W @ norm(E[t]) have mean entropy `target`."""
    sample = rng.choice(E.shape[0], size=min(32, E.shape[0]), replace=False)
    base = _rmsnorm_rows(E[sample]) @ W.T

    def entropy(g: float) -> float:
        z = base * g
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        return float(-(p * np.log(np.maximum(p, 1e-30))).sum(axis=1).mean())

    lo, hi = 0.1, 400.0
    for _ in range(24):
        mid = (lo * hi) ** 0.5
        if entropy(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def _orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def _layer(rng: np.random.Generator, spec: ModelSpec, contribution: float, width: int = 1) -> dict[str, np.ndarray]:
    """Weights of one transformer block (`width` times the spec's width); `contribution` scales
    what it adds to the residual stream."""
    d, ff, n_head = spec.n_embd * width, spec.n_ff * width, spec.n_head * width
    n_kv = (spec.n_head_kv or spec.n_head) * width
    head_dim = d // n_head
    d_kv = head_dim * n_kv
    qk_std = 1.2 / np.sqrt(d)
    R = _orthogonal(rng, d)
    wv = R[:d_kv]  # value heads: an orthogonal projection...
    # ...and the output projection maps them back, so O @ V is a scaled projection: attention
    # mixes earlier tokens' embeddings into the residual stream.
    groups = n_head // n_kv
    wo_blocks = [R[(h // groups) * head_dim : (h // groups + 1) * head_dim].T for h in range(n_head)]
    wo = np.concatenate(wo_blocks, axis=1) * (spec.attn_mix * contribution / groups)
    return {
        "attn_norm.weight": np.ones(d, np.float32),
        "attn_q.weight": (rng.standard_normal((d, d)) * qk_std).astype(np.float32),
        "attn_k.weight": (rng.standard_normal((d_kv, d)) * qk_std).astype(np.float32),
        "attn_v.weight": wv.astype(np.float32),
        "attn_output.weight": wo.astype(np.float32),
        "ffn_norm.weight": np.ones(d, np.float32),
        "ffn_gate.weight": (rng.standard_normal((ff, d)) / np.sqrt(d)).astype(np.float32),
        "ffn_up.weight": (rng.standard_normal((ff, d)) / np.sqrt(d)).astype(np.float32),
        "ffn_down.weight": (rng.standard_normal((d, ff)) * (spec.ffn_scale * contribution / np.sqrt(ff))).astype(
            np.float32
        ),
    }


def _block_diag(base: np.ndarray, new: np.ndarray, leak: np.ndarray | None = None) -> np.ndarray:
    """[[base, leak], [0, new]]: the new block works on the new dimensions; `leak` lets it
    write a little into the base dimensions."""
    out = np.zeros((base.shape[0] + new.shape[0], base.shape[1] + new.shape[1]), np.float32)
    out[: base.shape[0], : base.shape[1]] = base
    out[base.shape[0] :, base.shape[1] :] = new
    if leak is not None:
        out[: base.shape[0], base.shape[1] :] = leak
    return out


def _widen(tensors: dict[str, np.ndarray], spec: ModelSpec) -> dict[str, np.ndarray]:
    """Embed the base model in one `spec.widen` times as wide (heads and feed-forward too).

    The base weights keep acting on the first n_embd dimensions, so the wide model computes what
    the base computes, plus what its new heads and feed-forward units add through small `leak`
    blocks (relative size `spec.widen_scale`). RMSNorm weights are rescaled because the norm
    now averages over more (nearly empty) dimensions. Costs grow about as widen**2 per layer.
    """
    f, s = spec.widen, spec.widen_scale
    d = spec.n_embd
    D = d * f
    rng = np.random.default_rng([spec.seed, 5, f])
    new_units: dict[str, dict[str, np.ndarray]] = {}  # per layer: weights of the new units
    # RMSNorm over D dims of [x, ~s*x]: rescale the base dims back to the base model's values
    k = float(np.sqrt((d + (D - d) * s * s) / D))
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        layer, key = name.split(".", 2)[1:] if name.startswith("blk.") else ("", name)
        if layer and layer not in new_units:
            new_units[layer] = _layer(rng, spec, 1.0, width=f - 1)
        if name == "token_embd.weight":
            out[name] = np.concatenate([t, s * rng.standard_normal((t.shape[0], D - d)).astype(np.float32)], axis=1)
        elif name == "output.weight":
            std = float(t.std())
            out[name] = np.concatenate([t, s * std * rng.standard_normal((t.shape[0], D - d)).astype(np.float32)], axis=1)
        elif t.ndim == 1:  # norm weights
            out[name] = np.concatenate([t * k, np.full(D - d, float(t.mean()) * k, np.float32)])
        elif key in ("attn_output.weight", "ffn_down.weight"):
            new = new_units[layer][key] * s
            leak = s * float(t.std()) * rng.standard_normal((t.shape[0], new.shape[1])).astype(np.float32)
            out[name] = _block_diag(t, new, leak)
        else:
            out[name] = _block_diag(t, new_units[layer][key])
    return out


def _output_head(seed: int, d: int, successors: int, eos_rate: float, entropy: float, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, float]:
    """The embeddings E, the output matrix W (each token's successors favoured) and the output
    norm's scale g of the real tokens: a family's (its seed), the same for the models of one
    family (a sibling differs in its noise, added later), so the last one is kept."""
    key = (seed, d, successors, eos_rate, entropy, vocab.n_real, vocab.word_start, vocab.end_ids, tuple(vocab.tokens), tuple(vocab.types))
    with _last_head_lock:
        if _last_head and _last_head[0][0] == key:
            return _last_head[0][1]
    head = _compute_output_head(seed, d, successors, eos_rate, entropy, vocab)
    with _last_head_lock:
        _last_head[:] = [(key, head)]
    return head


_last_head: list[tuple[tuple, tuple[np.ndarray, np.ndarray, float]]] = []
_last_head_lock = threading.Lock()


def _compute_output_head(seed: int, d: int, successors: int, eos_rate: float, entropy: float, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, float]:
    n_real = vocab.n_real
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((n_real, d)).astype(np.float32)
    # Successors are ordinary tokens (not bytes, control or unused tokens). Three in four
    # successors start a word, so generated text reads as a string of words.
    ordinary = np.flatnonzero(np.asarray(vocab.types[:n_real]) == TT_NORMAL)
    mark = vocab.word_start
    is_word = np.array([vocab.tokens[t].startswith(mark) and len(vocab.tokens[t]) > 1 for t in ordinary])
    words, rest = ordinary[is_word], ordinary[~is_word]
    pick_word = rng.random((n_real, successors)) < 0.75
    succ = np.where(
        pick_word,
        words[rng.integers(0, len(words), size=(n_real, successors))],
        rest[rng.integers(0, len(rest), size=(n_real, successors))],
    )
    strength = (1.0 - 0.25 * np.arange(successors) / max(successors - 1, 1)).astype(np.float32)
    W = _successor_matrix(E, succ, strength, n_real)
    # A token that follows many tokens (EOS in a large vocabulary) would get a long output row and
    # win everywhere; scale rows back to the norm of a token with the average number of predecessors.
    predecessors = np.bincount(succ.ravel(), minlength=n_real)
    W /= np.sqrt(np.maximum(predecessors / successors, 1.0)).astype(np.float32)[:, None]
    if eos_rate > 0:
        # Each end token follows the tokens whose embeddings point furthest along a direction u of
        # its own (a share eos_rate of them), about as strongly as a middle successor; a
        # direction, unlike a successor list, gives it no hub row in large vocabularies.
        normed = _rmsnorm_rows(E)
        for end in vocab.end_ids:
            u = rng.standard_normal(d).astype(np.float32)
            u /= np.linalg.norm(u)
            projection = normed @ u
            threshold = max(float(np.quantile(projection, 1.0 - eos_rate)), 0.5)
            W[end] = u * (float(strength[successors // 2]) / threshold)
    g = _calibrate_scale(E, W, entropy, np.random.default_rng(seed + 7))
    return E, W, g


def build_weights(spec: ModelSpec, vocab: Vocab) -> dict[str, np.ndarray]:
    """All tensors of the model, float32, named as llama.cpp's architecture `spec.arch` expects."""
    if spec.n_embd % spec.n_head:
        raise ValueError("n_embd must be a multiple of n_head")
    if spec.arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}")
    d = spec.n_embd
    n_real = vocab.n_real
    E, W, g = _output_head(spec.seed, d, spec.successors, spec.eos_rate, spec.entropy, vocab)
    E, W = E.copy(), W.copy()  # the kept head stays as computed
    if vocab.size > n_real:
        # padding rows, as in families whose embedding matrices are padded: never predicted
        pad_rng = np.random.default_rng([spec.seed, 4])
        E = np.concatenate([E, pad_rng.standard_normal((vocab.size - n_real, d)).astype(np.float32)])
        W = np.concatenate([W, np.zeros((vocab.size - n_real, d), np.float32)])
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": E,
        "output_norm.weight": np.full(d, g, np.float32),
        "output.weight": W,
    }
    layer_rng = np.random.default_rng([spec.seed, 1])
    for i in range(spec.n_layer):
        for k, v in _layer(layer_rng, spec, 1.0).items():
            tensors[f"blk.{i}.{k}"] = v
    if spec.widen > 1:
        tensors = _widen(tensors, spec)
    extra_rng = np.random.default_rng([spec.seed, 2, spec.extra_layers])
    for i in range(spec.extra_layers):
        for k, v in _layer(extra_rng, spec, spec.extra_scale, width=spec.widen).items():
            tensors[f"blk.{spec.n_layer + i}.{k}"] = v
    if spec.noise > 0:
        noise_rng = np.random.default_rng([spec.seed, 3, spec.noise_seed])
        for name in sorted(tensors):
            t = tensors[name]
            if t.ndim == 2:
                scale = float(np.sqrt((t.astype(np.float64) ** 2).mean()))
                tensors[name] = t + (noise_rng.standard_normal(t.shape) * (spec.noise * scale)).astype(np.float32)
    if spec.arch == "qwen2":
        # Qwen2 adds biases to the query, key and value projections; small ones keep the model's
        # behaviour while llama.cpp runs the biased attention path
        bias_rng = np.random.default_rng([spec.seed, 6, spec.noise_seed if spec.noise else 0])
        for i in range(spec.n_layer + spec.extra_layers):
            for proj in ("q", "k", "v"):
                rows = tensors[f"blk.{i}.attn_{proj}.weight"].shape[0]
                tensors[f"blk.{i}.attn_{proj}.bias"] = np.asarray(0.02 * bias_rng.standard_normal(rows), dtype=np.float32)
    return tensors


ARCHITECTURES = ("llama", "qwen2")
_WRITTEN = {  # weight types the writer stores itself
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
}
assert tuple(_WRITTEN) == WRITTEN_TYPES


def write_model(spec: ModelSpec, path: str | os.PathLike[str], hint: str = "") -> Path:
    """Write the model described by `spec` to `path` and return the path: whole or not at all (a
    temporary file in the same folder, renamed when complete; a full or read-only disk is a
    one-line `StorageError`, `hint` saying what to do)."""
    if spec.dtype not in WEIGHT_TYPES:
        raise ValueError(f"dtype must be one of {', '.join(WEIGHT_TYPES)}")
    with atomic_path(path, hint) as tmp:
        if spec.dtype not in _WRITTEN:
            f16 = tmp.with_name(tmp.name + ".f16")
            try:
                _write(replace(spec, dtype="f16"), f16, file_spec=spec)
                quantize(f16, tmp, spec.dtype)
            finally:
                f16.unlink(missing_ok=True)
        else:
            _write(spec, tmp, file_spec=spec)
    return Path(path)


def _write(spec: ModelSpec, path: Path, file_spec: ModelSpec) -> None:
    """Write `spec` in a type the writer stores itself; `file_spec` is recorded in the metadata."""
    vocab = spec.vocab()
    tensors = build_weights(spec, vocab)
    n_layer = spec.n_layer + spec.extra_layers
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(spec.name)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.n_embd * spec.widen)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(spec.n_ff * spec.widen)
    w.add_head_count(spec.n_head * spec.widen)
    w.add_head_count_kv((spec.n_head_kv or spec.n_head) * spec.widen)
    w.add_rope_dimension_count(spec.n_embd // spec.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab.size)
    w.add_file_type(file_type(spec.dtype).value)
    if vocab.fields is None:
        w.add_tokenizer_model("llama")
        w.add_token_list(vocab.tokens)
        w.add_token_scores(vocab.scores)
        w.add_token_types(vocab.types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        for key, token in spec.fim_ids().items():
            w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", token)
    else:  # a real tokenizer, every field as it was
        for key, field in vocab.fields.items():
            if not (key == "tokenizer.chat_template" and spec.chat_template):
                w.add_key_value(key, field.value, field.type, field.item_type)
    if spec.chat_template:
        w.add_chat_template(spec.chat_template)
    w.add_string("localcos.synthetic.spec", json.dumps(asdict(file_spec), sort_keys=True))
    qtype = _WRITTEN[spec.dtype]
    for name, t in tensors.items():
        if t.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, t.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, t.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cached_path(spec: ModelSpec, cache_dir: str | os.PathLike[str]) -> Path:
    """Where `cached_model` keeps the model for `spec`."""
    return Path(cache_dir) / f"{spec.name}-{spec.key()}.gguf"


def cached_model(spec: ModelSpec, cache_dir: str | os.PathLike[str]) -> Path:
    """The model for `spec` in `cache_dir`, written on first use."""
    path = cached_path(spec, cache_dir)
    if not path.exists():
        write_model(spec, path, CACHE_HINT)
    return path


# A small ChatML-like template (plain-text markers: the synthetic vocabulary has no special tokens
# for them). Real models carry their own in tokenizer.chat_template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + '\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' + '\\n' }}{% endif %}"
)


def standard_test_models(
    directory: str | os.PathLike[str],
    *,
    vocab_size: int = 2048,
    dtype: str = "f32",
    tokenizer: str | None = None,
    arch: str = "llama",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Write the standard set of test models into `directory`; returns name -> path.

    base: the family's base model; sibling: base + noise; larger: base + 6 extra layers;
    other-tokenizer: same text pieces with other ids (with `tokenizer`: the synthetic one);
    padded: base with a padded vocabulary (synthetic tokenizer only). `tokenizer` is a GGUF file
    whose tokenizer the family takes (`vocab_size` is then the file's).
    """
    directory = Path(directory)
    base = ModelSpec(vocab_size=vocab_size, dtype=dtype, tokenizer=tokenizer, arch=arch, name="base")
    specs = {
        "base": base,
        "sibling": replace(base, noise=0.3, name="sibling"),
        "larger": replace(base, extra_layers=6, name="larger"),
        "other-tokenizer": replace(base, tokenizer=None, tokenizer_variant=1, name="other-tokenizer"),
    }
    if tokenizer is None:
        specs["padded"] = replace(base, pad_vocab_to=vocab_size + 128, name="padded")
    out = {}
    for name, spec in specs.items():
        if progress:
            progress(f"writing {name}")
        out[name] = write_model(spec, directory / f"{name}.gguf")
    return out
