"""Fill-in-the-middle: the FIM prompt as llama.cpp lays it out, where a middle ends, llama.cpp's
infill sampler, and editor completion served as llama-server (`/infill`, the bodies llama.vim and
llama.vscode send), Ollama (`suffix`, the `ollama` client) and OpenAI (`suffix`, the `openai`
client) serve it, through a real server on synthetic models whose vocabulary has the FIM tokens."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import ollama
import pytest

from fakes import FakeModel, exact_joint
from localcos import Ensemble, ExtraChunk, Infill, WeightedEnsemble
from localcos.backend import Model
from localcos.core.sampling import InfillSampler, Sampler
from localcos.core.text import TextAssembler
from localcos.errors import ConfigError
from localcos.eval.codetasks import humaneval_problems, infilling_tasks, load_tasks
from localcos.eval.sandbox import run_program, Limits
from localcos.core.constrained import Both
from localcos.core.healing import Healing, TokenBytes
from localcos.core.text import Cursor
from localcos.infill import MIDDLE_BLOCK, Budget, FimTokens, block_start, fim_prompt, middle_start
from localcos.testing.invariants import checked
from statcheck import assert_law
from test_fake_decoding import N  # the fakes' joint-law sample size
from test_server import serving

QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
PREFIX = "The river flows from the mountains\nand the old mill by the water\n"
TYPED = "two plus"
SUFFIX = "\nthe train leaves the station at\nonce upon a time there was\n"


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def fim_pair(models) -> list[Path]:
    return [models["fim"], models["fim_sibling"]]


# --- the prompt -----------------------------------------------------------------------------------------


def test_the_fim_prompt_is_llama_servers_layout_token_for_token(models):
    """llama-server's format_prompt_infill: the repository's header and each extra chunk after a
    file separator, the current file's separator, BOS, then the prefix's last 3/4 of n_batch and the
    typed part (its tokens after the prefix's), the suffix's first n_batch/4 - 2 - typed, the
    middle token; the extra chunks the tail of n_ctx - n_batch - 2 n_predict."""
    m = Model(models["fim"], vocab_only=True)
    fim = {text: m.tokenize(text, add_bos=False, special=True) for text in QWEN_FIM}
    assert all(len(ids) == 1 for ids in fim.values())  # single control tokens
    pre, suf, mid, pad, repo, sep = (fim[t][0] for t in QWEN_FIM)
    assert FimTokens.of(m) == FimTokens(pre, suf, mid, pad, repo, sep)

    def tok(text: str) -> list[int]:
        return m.tokenize(text, add_bos=False)

    extra = (ExtraChunk("import os\nimport sys\n", "a.py"), ExtraChunk("def helper():\n    return 1\n", "lib/b.py"))
    # a budget that cuts the prefix, the suffix and the extra chunks
    prefix, suffix = PREFIX * 6, SUFFIX * 6
    window, n_ctx, predict = 48, 160, 40
    header = [repo, *tok("myproject\n"), sep, *tok("a.py\n"), *tok(extra[0].text), sep, *tok("lib/b.py\n"), *tok(extra[1].text), sep, *tok("filename\n")]
    typed = m.tokenize(TYPED, add_bos=False, special=True)
    kept_prefix, kept_suffix = tok(prefix)[-36:], tok(suffix)[: 12 - 2 - len(typed)]
    n_extra = n_ctx - window - 2 * predict
    assert 0 < n_extra < len(header) and len(tok(prefix)) > 36 and len(tok(suffix)) > 10  # each part is cut
    expected = header[-n_extra:] + [m.bos, pre, *kept_prefix, *typed, suf, *kept_suffix, mid]
    got = fim_prompt(m, Infill(prefix, suffix, TYPED, extra), Budget(window, n_ctx, predict)).tokens
    assert got == expected
    # no repository context (the makers' prompt, and Ollama's and OpenAI's suffix): BOS, PRE, SUF, MID
    plain = fim_prompt(m, Infill(PREFIX, SUFFIX), Budget(512, 4096, 64)).tokens
    assert plain == [m.bos, pre, *tok(PREFIX), suf, *tok(SUFFIX), mid]
    # repository context with nothing to add: llama-server still writes its header and the file's name
    alone = fim_prompt(m, Infill(PREFIX, SUFFIX, extra=()), Budget(512, 4096, 64)).tokens
    assert alone == [repo, *tok("myproject\n"), sep, *tok("filename\n"), *plain]


def test_fim_tokens_come_from_the_header_or_their_text_and_end_a_middle(models):
    header = Model(models["fim_header"], vocab_only=True)
    from conftest import SPECS

    ids = SPECS["fim_header"].fim_ids()
    assert FimTokens.of(header) == FimTokens(ids["pre"], ids["suf"], ids["mid"], ids["pad"], ids["rep"], ids["sep"])
    with pytest.raises(ConfigError, match="t-base has no fill-in-the-middle prefix, suffix, middle token"):
        FimTokens.of(Model(models["base"], vocab_only=True))
    # llama.cpp ends a generation at the FIM pad, repository and file-separator tokens
    with Ensemble.load([models["fim"]], n_ctx=256) as ens:
        fim = FimTokens.of(ens.models[0])
        assert {fim.pad, fim.repo, fim.sep} <= ens.end_tokens


def test_the_cached_layout_reads_the_suffix_first_and_heals_the_cursors_token(models):
    """`cached`: [BOS] PRE prefix-above SUF suffix MID cursor's-block+typed, the prefix and the
    typed part one text cut where the cursor's block begins (`middle_start`), the tokens of the
    word the cursor is in taken back (` pl` `u` `s` of `two plus`: not ` two`, before a space)
    and their bytes the cursor's healed bytes; the suffix's first window/4 - 2 tokens whatever is
    typed; the repository header first, as in the makers' layout. `makers-healed`: the makers'
    tokens with the last before SUF taken back, only that one."""
    m = Model(models["fim"], vocab_only=True)
    pre, suf, mid = (m.tokenize(t, add_bos=False, special=True)[0] for t in QWEN_FIM[:3])

    def tok(text: str) -> list[int]:
        return m.tokenize(text, add_bos=False)

    budget = Budget(96, 4096, 16)
    prefix = PREFIX + "the bells ring out at noon\nfar over the green hills\n"
    text = prefix + TYPED
    at = middle_start(text, MIDDLE_BLOCK)
    assert 0 < at < len(prefix) and text[at - 1] == "\n" and len(tok(text)) < 72  # the case: a whole line above begins the block; nothing cut
    begun = tok(text[at:])
    word = len(begun) - len(tok(text[at : text.index(" plus")]))  # the tokens of "plus", its space with them
    assert word == 3 and b"".join(m.piece(t) for t in begun[-word:]) == b" plus"  # the word cut in three: the case
    cached = fim_prompt(m, Infill(prefix, SUFFIX * 3, TYPED), budget, "cached")
    assert cached.tokens == [m.bos, pre, *tok(text[:at]), suf, *tok(SUFFIX * 3)[:22], mid, *begun[:-word]]
    assert cached.cursor == Cursor(b" plus", SUFFIX * 3)
    assert fim_prompt(m, Infill(prefix, SUFFIX * 3, TYPED + " "), budget, "cached").cursor == Cursor(b" ", SUFFIX * 3)  # no word: one token
    # a keystroke changes only the prompt's end: everything up to the prefix is the same tokens
    more = fim_prompt(m, Infill(prefix, SUFFIX * 3, TYPED + " the"), budget, "cached").tokens
    assert more[: len(cached.tokens)] == cached.tokens and len(more) > len(cached.tokens)
    makers = fim_prompt(m, Infill(prefix, SUFFIX * 3, TYPED), budget).tokens
    assert len(makers[makers.index(suf) + 1 : -1]) < 22  # the makers' suffix budget shrinks with what is typed
    # no line above begins a block: all of the prefix is read after the middle token
    assert middle_start(PREFIX + TYPED, MIDDLE_BLOCK) == 0
    alone = fim_prompt(m, Infill(PREFIX, SUFFIX, TYPED), budget, "cached").tokens
    assert alone[:2] == [m.bos, pre] and alone[2] == suf and tok(PREFIX + TYPED)[: len(alone) - alone.index(mid) - 1] == alone[alone.index(mid) + 1 :]
    healed = fim_prompt(m, Infill(PREFIX, SUFFIX, TYPED), budget, "makers-healed")
    typed = m.tokenize(TYPED, add_bos=False, special=True)
    assert healed.tokens == [m.bos, pre, *tok(PREFIX)[-72:], *typed[:-1], suf, *tok(SUFFIX)[: 24 - 2 - len(typed)], mid]
    assert healed.cursor == Cursor(m.piece(typed[-1])) and fim_prompt(m, Infill(PREFIX, SUFFIX, TYPED), budget).cursor is None
    extra = (ExtraChunk("import os\n", "a.py"),)
    header = fim_prompt(m, Infill(PREFIX, SUFFIX, TYPED, extra), Budget(512, 4096, 16), "cached").tokens
    assert header[: header.index(m.bos)] == fim_prompt(m, Infill(PREFIX, SUFFIX, TYPED, extra), Budget(512, 4096, 16)).tokens[: header.index(m.bos)]
    # nothing before the cursor: nothing to heal
    assert fim_prompt(m, Infill("", SUFFIX), budget, "cached").cursor == Cursor(b"", SUFFIX)


def test_the_cached_layouts_middle_begins_at_the_cursors_block_which_moves_only_as_lines_end():
    """middle_start: a whole line's start before the cursor's line (0 for none); it stays put
    while the cursor's line is typed, never moves back as lines are added, and moves about once
    every `block` lines, not at each."""
    lines = [f"    value_{i} = compute({i}, {i * 7 % 13})" for i in range(200)]
    block, starts = 4, []
    for n in range(1, 200):
        above = "\n".join(lines[:n]) + "\n"
        at = [middle_start(above + lines[n][:k], block) for k in range(0, len(lines[n]), 7)]
        assert len(set(at)) == 1 and at[0] < len(above) and (at[0] == 0 or above[at[0] - 1] == "\n")  # put while the line is typed
        starts.append(at[0])
    assert starts == sorted(starts)
    moves = sum(a != b for a, b in zip(starts, starts[1:]))
    assert 200 / (3 * block) < moves < 200 / (block / 3), moves
    assert middle_start("one line typed", block) == 0 and middle_start("", block) == 0


def test_a_long_prefix_starts_at_a_blocks_first_line_which_stays_put_as_the_window_slides():
    """block_start: a prefix over its budget starts where a line begins, leaves at most the budget,
    and keeps its start while an editor's window of lines slides down one line at a time (a line
    typed at the end, the first dropped), moving about once every `block` lines."""
    lines = [f"    value_{i} = compute({i}, {i * 7 % 13})" for i in range(400)]

    def tokens(text: str) -> list[int]:
        return text.split(" ")  # type: ignore[return-value]  # a word a token: enough to count

    most, block, starts = 300, 8, []
    for top in range(0, 150):
        window = "\n".join(lines[top : top + 100]) + "\n    typed"
        kept = block_start(window, most, block, tokens)
        assert window.endswith(kept) and len(tokens(kept)) <= most and (kept == window or window[len(window) - len(kept) - 1] == "\n")
        starts.append(kept.partition("\n")[0])
    moves = sum(a != b for a, b in zip(starts, starts[1:]))
    assert 150 / (4 * block) < moves < 150 / (block / 4), moves  # about once every `block` lines, not at every one
    assert block_start("short\ntext", most, block, tokens) == "short\ntext"  # within the budget: whole
    every = [block_start("\n".join(lines[top : top + 100]), most, 1, tokens) for top in range(3)]
    assert len({k.partition("\n")[0] for k in every}) == 3  # a block of one line: the start moves with the window


def test_healing_allows_exactly_the_tokens_that_agree_with_the_cursors_bytes():
    """TokenBytes and Healing against a brute-force reading of the rule: a token whose bytes
    begin with the healed bytes still to come, or are a beginning of them that leaves a rest
    some token writes; every token once they are written; a disagreeing token refused."""
    pieces = [b"\n", b"    ", b"   ", b" ", b"re", b"ret", b"return", b"rn", b"\xc3", b"\xa9", b"\xc3\xa9", b"caf", b"", b"\n    ", b"zz\xff", b"\xff"]
    vocab = TokenBytes(pieces)

    def allowed(mask: np.ndarray) -> set[int]:
        return {t for t in range(len(pieces)) if (int(mask[t >> 5]) >> (t & 31)) & 1}

    def brute(rest: bytes) -> set[int]:
        def writable(b: bytes) -> bool:
            return not b or any(p and (p.startswith(b) or b.startswith(p) and writable(b[len(p) :])) for p in pieces)

        return {t for t, p in enumerate(pieces) if p and (p.startswith(rest) or rest.startswith(p) and writable(rest[len(p) :]))}

    for healed in (b"    ", b"ret", b"caf\xc3\xa9", b"\n    ", b"zz\xff", b"\xff\xff"):
        h = Healing(vocab, healed)
        covered = 0
        while h.binds():
            got = allowed(h.mask())
            assert got == brute(healed[covered:]) and got, healed
            token = max(got, key=lambda t: (len(pieces[t]) <= len(healed) - covered, -len(pieces[t])))  # the shortest that agrees
            refused = next((t for t in range(len(pieces)) if t not in got), None)
            if refused is not None:
                assert not h.consume(refused)
            assert h.consume(token)
            covered += len(pieces[token])
        assert len(allowed(h.mask())) == len(pieces)  # written: every token (as Both asks it)
        h.rollback(len(h.consumed))
        assert h.binds() and allowed(h.mask()) == brute(healed)
    assert vocab.beginning_with(b"\xff").tolist() == [15] and vocab.beginning_with(b"re").tolist() == [4, 5, 6]
    # under a grammar too: a token both allow; one the second refuses leaves the first as it was
    both = Both(Healing(vocab, b"re"), Healing(vocab, b"ret"))
    assert allowed(both.mask()) == brute(b"re") & brute(b"ret") == {5, 6}
    assert not both.consume(4) and both.first.consumed == both.second.consumed == []
    assert both.consume(5) and not both.binds() and both.consumed == [5]


def test_the_healed_bytes_are_the_prefixs_and_a_middle_that_runs_into_the_suffix_ends_where_it_begins():
    """TextAssembler with a cursor: the healed bytes are dropped from the text; a line of the
    middle that ends with the suffix up to its first non-blank line ends the text before it:
    the rest of the cursor's line matched at the character (where the suffix begins inside the
    line), a line equal to the next line, or that line after the blank text before it. Where the
    suffix goes on inside a block, a new line at the margin ends the text at its last line."""

    def middle(pieces: list[str], suffix: str, healed: bytes = b"", stop: tuple[str, ...] = ()) -> TextAssembler:
        text = TextAssembler(lambda i: pieces[i].encode(), stop, cursor=Cursor(healed, suffix))
        streamed = ""
        for i in range(len(pieces)):
            ended = text.push(i)
            streamed += text.take_final()
            if ended:
                break
        text.finish()
        assert streamed + text.take_final() == text.text  # what streams out is never taken back
        return text

    # the healed bytes, however the model cut them into tokens
    assert middle(["    ret", "urn x", "\n"], "", healed=b"    re").text == "turn x\n"
    assert middle(["  ", "  return", " x"], "", healed=b"    ").text == "return x"
    # the rest of the cursor's line, where the suffix begins inside it: cut where it ends the line
    t = middle(["foo(x", "))", "\n", "bar\n"], "))\n    return y\n")
    assert (t.text, t.ended_by) == ("foo(x", "suffix")
    assert middle(["x)", " + 1"], ")\n").text == "x) + 1"  # not at the line's end: kept
    # a line equal to the suffix's first line (the cursor at a line's start, HumanEval's single lines)
    t = middle(["    y = 1\n", "    return y", "\n", "print()"], "    return y\n\nprint(f(2))\n")
    assert (t.text, t.ended_by) == ("    y = 1\n", "suffix")
    assert middle(["z =     return y\n"], "    return y\n").text == "z = "  # the cursor's own line: matched at the character
    # the cursor at a line's end: the suffix begins with a new line (and a blank one), matched with it
    t = middle(["1", "\n", "\n    return y  ", "\n"], "\n\n    return y\n")
    assert (t.text, t.ended_by) == ("1", "suffix")
    t = middle(["1\n", "    z = 2\n", "    return y"], "\n    return y\n")  # at the text's end too
    assert (t.text, t.ended_by) == ("1\n    z = 2", "suffix")
    # a line that is not the suffix's: nothing cut; a blank suffix: no rule
    t = middle(["1\n", "    return z\n"], "\n    return y\n")
    assert (t.text, t.ended_by) == ("1\n    return z\n", None)
    assert middle(["a\n", "\n"], "\n\n").text == "a\n\n"
    # a stop string still ends the text first
    assert middle(["a STOP", " b\n"], "\n b\n", stop=("STOP",)).ended_by == "word"
    # the suffix inside a block: a new line at the margin ends the middle at its last line that is not blank
    t = middle(["x + y", "\n\n", "if __name__", ":\n"], "\n    return z\n")
    assert (t.text, t.ended_by) == ("x + y", "block")
    t = middle(["a\n", "    b\n", "\n", "```\n"], "\n\n        c\n")
    assert (t.text, t.ended_by) == ("a\n    b", "block")
    # indented lines and blank ones do not; nor a line at the margin where the suffix is at it; nor the cursor's own line
    assert (t := middle(["a\n", "\n", "    b\n"], "\n    c\n")).text == "a\n\n    b\n" and t.ended_by is None
    assert (t := middle(["a\n", "b\n"], "\nc\n")).text == "a\nb\n" and t.ended_by is None
    assert (t := middle(["import os\n", "    x"], "\n    y\n")).text == "import os\n    x" and t.ended_by is None


# --- where a middle ends -------------------------------------------------------------------------------


def _text(pieces: list[str], **rules) -> TextAssembler:
    text = TextAssembler(lambda i: pieces[i].encode(), **rules)
    for i in range(len(pieces)):
        if text.push(i):
            break
    text.finish()
    return text


def test_an_editors_rules_end_the_text_as_llama_server_ends_it():
    # n_indent: the first line after a new line indented by fewer characters ends the text at its
    # first character (its white space kept); a blank line too; the cursor's own line never
    t = _text(["x = 1", "\n    y", " = 2\n", "z = 3\n"], indent=4)
    assert (t.text, t.ended_by) == ("x = 1\n    y = 2\n", "indent")
    t = _text(["x = 1\n", "  ", " y\n"], indent=4)
    assert (t.text, t.ended_by) == ("x = 1\n   ", "indent")
    t = _text(["  x = 1\n", "    y\n", "\n", "    z\n"], indent=4)
    assert (t.text, t.ended_by) == ("  x = 1\n    y\n", "indent")
    t = _text(["a", "\nb"], indent=0)
    assert (t.text, t.ended_by) == ("a\nb", None)
    # t_max_predict_ms: once late, the next token holding a new line ends the text after it
    late = iter([False, True, True])
    t = _text(["a\n", "b", "c\nd", "e"], late=lambda: next(late))
    assert (t.text, t.ended_by) == ("a\nbc\nd", "time")
    t = _text(["ab", "cd", "STOPx"], stop=["STOP"])
    assert (t.text, t.ended_by, t.word) == ("abcd", "word", "STOP")


# --- llama.cpp's infill sampler --------------------------------------------------------------------------


def _infill_sampler(texts: list[bytes], end: set[int], fallback: int) -> InfillSampler:
    mask = np.zeros(len(texts), dtype=bool)
    mask[sorted(end)] = True
    return InfillSampler(mask, lambda t: texts[t], fallback)


def test_the_infill_sampler_is_llama_cpps():
    texts = [b"", b"ab", b"abc", b"x", b"ret", b"return", b"y"]  # token 0: the end token (no text)
    s = _infill_sampler(texts, {0}, 0)

    def apply(p: list[float]) -> np.ndarray:
        row = np.array(p, dtype=np.float32)
        s.apply(row)
        return row

    # the end tokens hold enough: only they stay (3 * 0.2 * 3 candidates > 0.8)
    assert apply([0.2, 0.4, 0.0, 0.4, 0, 0, 0]) == pytest.approx([1, 0, 0, 0, 0, 0, 0])
    # "ab" begins "abc": the likelier takes both; then the candidates under 0.2, then under 1/(n+1)
    out = apply([0.01, 0.3, 0.5, 0.19, 0, 0, 0])
    assert out == pytest.approx([0.01 / 0.81, 0, 0.8 / 0.81, 0, 0, 0, 0], abs=1e-6)
    out = apply([0.0, 0.0, 0.0, 0.3, 0.23, 0.2, 0.27])  # "ret" + "return" = 0.43; x 0.3; y 0.27: all >= 1/4 after
    assert out == pytest.approx([0, 0, 0, 0.3, 0.43, 0, 0.27], abs=1e-6)
    out = apply([0.0, 0.0, 0.0, 0.3, 0.25, 0.21, 0.24])  # y 0.24 passes 0.2, then not 1/4
    assert out == pytest.approx([0, 0, 0, 0.3 / 0.76, 0.46 / 0.76, 0, 0], abs=1e-6)
    # no text candidate reaches 0.2: the fallback end token alone
    letters = _infill_sampler([b"", b"a", b"b", b"c", b"d", b"e", b"f", b"g"], {0}, 0)
    row = np.array([0.0001, 0.15, 0.15, 0.15, 0.15, 0.15, 0.15, 0.0999], dtype=np.float32)
    letters.apply(row)
    assert row == pytest.approx([1, 0, 0, 0, 0, 0, 0, 0])


class _Fake(FakeModel):
    eot = 0  # the infill sampler's fallback token (the fakes' end token lies outside their vocabulary)


@pytest.mark.parametrize("method, gamma", [("ensemble", None), ("sd", 3), ("cos", 2)])
def test_every_method_samples_the_infill_samplers_r_exactly(method, gamma):
    """The infill sampler is part of r's finalisation: a speculative method's drafts are verified
    against it, so the joint law of continuations is the transformed r's (chi-square)."""
    models = [_Fake(seed=40 + i, n_vocab=12, n_params=1000 * (i + 1), sharpness=1.0) for i in range(2)]  # " t1" begins " t10", " t11"
    ens = Ensemble(models, WeightedEnsemble([0.5, 0.5]))
    settings = dict(top_k=6, top_p=0.95, samplers=("top_k", "top_p", "infill"))
    outs = checked(ens).generate_many([1, 2], N, method=method, gamma=gamma, max_tokens=3, seed=zlib.crc32(method.encode()), **settings)
    sampler = replace(Sampler(top_k=6, top_p=0.95), infill=ens.infill_sampler())
    law = exact_joint(models, ens.combiner, sampler, [1, 2], 3)
    assert law.keys() != exact_joint(models, ens.combiner, Sampler(top_k=6, top_p=0.95), [1, 2], 3).keys()  # it changes r here
    assert_law(outs, law, f"{method} with the infill sampler")


class _FimFake(FakeModel):
    """A fake with FIM tokens (its last three ids): its token " t1" begins " t10" to " t13", so
    the cursor's token healed leaves the model a choice."""

    add_bos = False
    label = "fim fake"

    def fim_tokens(self) -> dict[str, int | None]:
        return {"prefix": self.n_vocab - 3, "suffix": self.n_vocab - 2, "middle": self.n_vocab - 1}

    def pieces(self) -> list[bytes]:
        return [self.piece(t) for t in range(self.n_vocab)]


@pytest.mark.parametrize("method, gamma, proposer", [("ensemble", None, None), ("sd", 3, None), ("cos", 2, None), ("cos", 2, "lookup")])
def test_every_method_samples_r_healed_at_the_cursor_exactly(method, gamma, proposer):
    """The cursor's token healed is a constraint on the first rows: the joint law of the
    continuations is r restricted to the tokens that agree with its bytes, then r itself
    (chi-square), for every method; the text is the middle after those bytes."""
    models = [_FimFake(seed=50 + i, n_vocab=14, n_params=1000 * (i + 1), sharpness=1.0) for i in range(2)]
    ens = Ensemble(models, WeightedEnsemble([0.5, 0.5]))
    outs = checked(ens).generate_many(Infill("5 1", ""), N, method=method, gamma=gamma, proposer=proposer, max_tokens=3, infill_layout="cached",
                                      seed=zlib.crc32(f"{method}{proposer}".encode()))  # fmt: skip
    pre, suf, mid = 11, 12, 13
    law = exact_joint(models, ens.combiner, Sampler(), [pre, suf, mid, 5], 3, allowed=lambda before, t: bool(before) or t == 1 or t >= 10)
    assert_law(outs, law, f"{method} healed")
    for out in outs[:50]:
        assert out.text == "".join(models[0].piece(t).decode() for t in out.token_ids)[3:]  # " t1" is the prefix's


def test_cos_where_no_draft_pays_still_verifies_what_the_cells_held():
    """--gamma auto where every row costs a call (a model's draft never pays): the suggestion the
    cells hold after the prompt is still verified, as one draft, in the call the ensemble makes
    anyway; the text is the ensemble's (greedy)."""
    from localcos.core.speedmodel import CallProfile

    models = [_FimFake(seed=70 + i, n_vocab=14, n_params=1000 * (i + 1)) for i in range(2)]
    for m in models:
        m.call_profile = CallProfile({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0})
    ens = Ensemble(models, WeightedEnsemble([0.5, 0.5]))
    kw = dict(method="cos", max_tokens=8, temperature=0, infill_layout="cached", cache_prompt=True, ignore_eos=True)
    first = ens.generate(Infill("5 1", ""), **kw)
    again = ens.generate(Infill("5 1", ""), **kw)
    assert first.stats.proposed == 0 and again.token_ids == first.token_ids
    assert again.stats.held_proposed == again.stats.held_accepted == 7  # every token but the last is in the cells


class _LineFake(_FimFake):
    """A FIM fake whose every token is a line of its own: its id and a new line."""

    def piece(self, token: int, special: bool = False) -> bytes:
        return f"{token}\n".encode()


@pytest.mark.parametrize("method, gamma", [("ensemble", None), ("cos", 2)])
def test_a_middle_that_runs_into_the_suffix_ends_where_it_begins(method, gamma):
    """The cached layout, greedy: once the middle writes the suffix's first line, it ends before
    it (finish_reason stop, /infill's stop_type eos); the tokens committed are the middle's and
    that line's. A line at the margin where the suffix is indented ends it too."""
    from localcos.server.infill import stop_type

    models = [_LineFake(seed=90 + i, n_vocab=14, n_params=1000 * (i + 1), sharpness=0.7) for i in range(2)]
    ens = Ensemble(models, WeightedEnsemble([0.5, 0.5]))
    cut = 0
    for line in range(11):
        out = ens.generate(Infill("5 1", f"{line}"), method=method, gamma=gamma, max_tokens=40, temperature=0, infill_layout="cached")
        written = "".join(models[0].piece(t).decode() for t in out.token_ids or [])[2:]  # "1\n" is the prefix's
        lines = written.splitlines()
        if f"{line}" in lines:
            assert (out.text, out.stopped_by, out.finish_reason) == ("".join(f"{x}\n" for x in lines[: lines.index(f"{line}")]), "suffix", "stop")
            assert lines.index(f"{line}") == len(lines) - 1 and stop_type(out) == ("eos", "")
            cut += 1
        else:
            assert out.stopped_by is None and out.text == written
    assert cut >= 3  # the rule was put to the test
    # the suffix inside a block: the middle's second line, at the margin, ends it at the end of its first
    out = ens.generate(Infill("5 1", "\n    4"), method=method, gamma=gamma, max_tokens=40, temperature=0, infill_layout="cached")
    first = models[0].piece((out.token_ids or [0, 0])[1]).decode().rstrip("\n")
    assert (out.text, out.stopped_by, out.finish_reason, stop_type(out)) == (first, "block", "stop", ("eos", ""))
    assert len(out.token_ids or []) == 3  # the healed "1\n", the first line, and the line that left the block


def test_the_infill_sampler_needs_top_k_and_the_token_level():
    from localcos import GenerationConfig

    with pytest.raises(ConfigError, match="put top_k before it"):
        GenerationConfig(samplers=("top_p", "infill"), top_p=0.9)
    with pytest.raises(ConfigError, match="in the order"):
        GenerationConfig(samplers=("infill", "top_k"), top_k=40)
    with pytest.raises(ConfigError, match="'dry' is not a sampler localcos has"):
        GenerationConfig(samplers=("dry",))
    # unnamed samplers are off, temperature 1 (llama-server's chain)
    assert GenerationConfig(samplers=("top_k",), top_k=4, top_p=0.5, temperature=0).sampler() == Sampler(1.0, 4, 1.0, 0.0)


# --- served ----------------------------------------------------------------------------------------------

VIM = {  # llama.vim's request (autoload/llama.vim, llama#fim), its fields as it sends them
    "id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [{"text": "import os\n", "time": 1.0, "filename": "a.py"}],
    "prompt": TYPED, "n_predict": 16, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
    "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "model": "",
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms", "timings/prompt_per_second",
                        "timings/predicted_n", "timings/predicted_ms", "timings/predicted_per_token_ms", "timings/predicted_per_second",
                        "truncated", "tokens_cached"],
}  # fmt: skip
VIM_WARM_UP = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": [{"text": "import os\n", "time": 1.0, "filename": "a.py"}],
               "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
               "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}  # fmt: skip
VSCODE = {  # llama.vscode's (src/llama-server.ts, createRequestPayload)
    "id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [], "prompt": TYPED, "n_predict": 12, "n_cmpl": 3,
    "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
    "t_max_prompt_ms": 500, "t_max_predict_ms": 2500,
}  # fmt: skip


@pytest.fixture(scope="module")
def fim_server(fim_pair):
    with serving(["--models", ",".join(map(str, fim_pair)), "--ctx", "1024", "--alias", "fim"]) as s:
        yield s


def _infill(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/infill", json=body, timeout=120)


def test_editors_infill_requests_are_answered_as_llama_server_answers_them(fim_server, fim_pair):
    # the warm-up llama.vim sends with its ring buffer's chunks: the prompt's cells, no text
    warm = _infill(fim_server, VIM_WARM_UP)
    assert warm.status_code == 200 and warm.json() == {"": None}
    answer = _infill(fim_server, {**VIM, "seed": 11})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == set(VIM["response_fields"]) and body["truncated"] is False and body["timings/predicted_n"] >= 1
    # one seed, one text: the library's fill of the same fields, with the same sampler chain
    with Ensemble.load(fim_pair, n_ctx=1024) as ens:
        own = ens.generate(Infill(PREFIX, SUFFIX, TYPED, (ExtraChunk("import os\n", "a.py"),)), max_tokens=16, seed=11, top_k=40, top_p=0.9,
                           samplers=("top_k", "top_p", "infill"), t_max_predict_ms=1000)  # fmt: skip
    assert body["content"] == own.text
    # the same prompt again: its cells and the row after it are kept, nothing of it is evaluated again (and
    # with lookup off, the suggestion the cells hold after it is not drafted: the same sampled text)
    again = _infill(fim_server, {**VIM, "seed": 11, "lookup": "off"}).json()
    assert again["content"] == body["content"] and again["timings/prompt_n"] == 0 < body["timings/prompt_n"]
    # drafted (lookup on, the default): sampled as r by the usual rule, so another text of the same law
    drafted = _infill(fim_server, {**VIM, "seed": 11, "response_fields": ["timings/prompt_n", "localcos"]}).json()
    assert drafted["timings/prompt_n"] == 0 and drafted["localcos"]["held_proposed"] > 0
    # llama.vscode's: three completions, a list of llama-server's objects
    three = _infill(fim_server, VSCODE)
    assert three.status_code == 200, three.text
    results = three.json()
    assert isinstance(results, list) and [r["index"] for r in results] == [0, 1, 2]
    for r in results:
        assert r["stop"] is True and r["stop_type"] in ("eos", "limit", "word") and r["tokens_evaluated"] > 0 and "prompt_ms" in r["timings"]


def test_infill_streams_its_pieces_then_its_last_object(fim_server):
    greedy = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": TYPED, "n_predict": 12, "temperature": 0}
    whole = _infill(fim_server, greedy).json()
    events = []
    with httpx.stream("POST", fim_server.url + "/infill", json={**greedy, "stream": True}, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    assert "".join(e["content"] for e in events[:-1]) == whole["content"] == events[-1]["content"]


def test_each_stop_rule_ends_a_middle_and_says_which(fim_server):
    base = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0, "ignore_eos": True}
    free = _infill(fim_server, {**base, "n_predict": 40}).json()
    assert free["stop_type"] == "limit" and free["tokens_predicted"] == 40 and free["stopping_word"] == ""
    text = free["content"]
    # a stop string: the text before it, stop_type word and the word
    word = text[5:8]
    stopped = _infill(fim_server, {**base, "n_predict": 40, "stop": [word]}).json()
    assert (stopped["content"], stopped["stop_type"], stopped["stopping_word"]) == (text[: text.index(word)], "word", word)
    # an end token: stop_type eos, before the limit
    sampled = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 200, "seed": 3, "samplers": ["top_k", "infill"], "top_k": 40}
    ended = _infill(fim_server, sampled).json()
    assert ended["stop_type"] in ("eos", "limit") and (ended["stop_type"] == "eos") == (ended["tokens_predicted"] < 200)


class _Lines(FakeModel):
    """A fake whose tokens are a new line, white space and words: text with lines and indents."""

    PIECES = ["\n", "    ", "  ", "x", "y = ", "1", "\n    ", "z"]

    def piece(self, token: int, special: bool = False) -> bytes:
        return self.PIECES[token].encode()


@pytest.mark.parametrize("method, gamma", [("ensemble", None), ("cos", 3), ("sd", 2)])
def test_an_editors_rules_end_every_methods_text_where_they_say(method, gamma):
    models = [_Lines(seed=60 + i, n_vocab=len(_Lines.PIECES), n_params=1000 * (i + 1), sharpness=0.5) for i in range(2)]
    ens = Ensemble(models, WeightedEnsemble([0.5, 0.5]))
    free = ens.generate([3, 4], method=method, gamma=gamma, max_tokens=60, temperature=0)
    assert free.text.count("\n") >= 2 and free.stopped_by is None
    for n_indent in (3, 5):
        cut = checked(ens).generate([3, 4], method=method, gamma=gamma, max_tokens=60, temperature=0, n_indent=n_indent)
        reference = _text([_Lines.PIECES[t] for t in free.token_ids or []], indent=n_indent)
        assert (cut.text, cut.stopped_by, cut.finish_reason) == (reference.text, "indent", "length")
    late = checked(ens).generate([3, 4], method=method, gamma=gamma, max_tokens=60, temperature=0, t_max_predict_ms=0.001)
    first = next(k for k, t in enumerate(free.token_ids or []) if "\n" in _Lines.PIECES[t])
    assert (late.text, late.stopped_by) == ("".join(_Lines.PIECES[t] for t in (free.token_ids or [])[: first + 1]), "time")


def _typed_through(model: Model, healed: bytes, tokens: list[int], j: int) -> str:
    """The text of a suggestion's first `j` tokens, as typed after the cursor (its `healed`
    bytes, the prefix's, left out)."""
    return b"".join(model.piece(t) for t in tokens[:j])[len(healed) :].decode()


def test_a_keystroke_in_the_cached_layout_evaluates_what_was_typed_and_verifies_the_last_suggestion_as_a_draft(models):
    """With the cells of the last request kept: typing the first tokens of the suggestion costs
    the prompt one token (inside the cursor's word, which the prompt leaves out, no new one), and
    the rest of the suggestion, held in the cells after the new prompt, is verified as a draft in
    one call: the text is the model's own middle there (synthetic F32: a fresh evaluation's, token
    for token), counted through the decode calls. A character it does not have: the draft stops
    where it disagrees and the model writes on as usual."""
    with Ensemble.load([models["fim"]], n_ctx=1024) as ens:
        m = ens.models[0]
        calls: list[list[int]] = []  # the tokens of each llama_decode call
        decode = m.decode
        m.decode = lambda parts: calls.append([len(tokens) for _, tokens, _, _ in parts]) or decode(parts)  # type: ignore[method-assign]
        cached = dict(max_tokens=16, temperature=0, infill_layout="cached", proposer="lookup")
        budget = Budget(m.n_batch, m.n_ctx, 16)
        grew = []
        for before, j in ((TYPED + " ", 2), (TYPED + " ", 5), (TYPED, 5)):  # after a space; inside the word " plus"
            first = ens.generate(Infill(PREFIX, SUFFIX, before), cache_prompt=True, **cached)
            assert first.token_ids and len(first.token_ids) == 16
            prompt = fim_prompt(m, Infill(PREFIX, SUFFIX, before), budget, "cached")
            typed = before + _typed_through(m, prompt.cursor.healed, first.token_ids, j)
            now = fim_prompt(m, Infill(PREFIX, SUFFIX, typed), budget, "cached").tokens
            cells = prompt.tokens + first.token_ids[:-1]  # the last token written was never evaluated
            assert cells[: len(now)] == now and typed != before  # the case: the new prompt is what the cells hold
            grew.append(len(now) - len(prompt.tokens))
            held = min(len(cells) - len(now), 15)  # the last of max_tokens is the first past the draft
            own = ens.generate(Infill(PREFIX, SUFFIX, typed), **cached)  # a fresh evaluation, nothing kept
            ens.generate(Infill(PREFIX, SUFFIX, before), cache_prompt=True, **cached)  # the suggestion in the cells again
            calls.clear()
            again = ens.generate(Infill(PREFIX, SUFFIX, typed), cache_prompt=True, **cached)
            assert again.token_ids == own.token_ids and again.text == own.text
            assert again.stats.prompt_evaluated == 1 < own.stats.prompt_evaluated, (j, again.stats.prompt_evaluated)
            assert again.stats.held_proposed == again.stats.held_accepted == held >= 16 - j, again.stats
            # one call evaluates the prompt's last token and scores the held draft (its last row the first token
            # past it); then one a token up to max_tokens
            assert calls == [[1 + held]] + [[1]] * (15 - held), calls
            assert own.stats.calls[0] == 15  # fresh: one a token, the first from the prompt's row
        assert grew[0] > 0 and grew[1] > grew[0] and grew[2] == 0, grew  # typed tokens past a word; none inside one
        ens.generate(Infill(PREFIX, SUFFIX, TYPED), cache_prompt=True, **cached)
        other = ens.generate(Infill(PREFIX, SUFFIX, TYPED + "Q"), cache_prompt=True, **cached)
        assert other.stats.held_accepted == other.stats.held_proposed < 15  # drafted up to where the word disagrees
        assert other.text == ens.generate(Infill(PREFIX, SUFFIX, TYPED + "Q"), **cached).text


def test_ollama_and_openai_clients_fill_in_the_middle_with_suffix(fim_server, fim_pair):
    client = ollama.Client(host=fim_server.url)
    show = client.show("fim")
    assert ".Suffix" in show.template and "insert" in show.capabilities  # how Continue finds a FIM model
    got = client.generate("fim", PREFIX, suffix=SUFFIX, options={"temperature": 0, "num_predict": 16})
    openai_text = fim_server.client().completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0).choices[0].text
    with Ensemble.load(fim_pair, n_ctx=1024) as ens:
        own = ens.generate(Infill(PREFIX, SUFFIX), max_tokens=16, temperature=0)
    assert got.response == openai_text == own.text
    cli = run("generate", "--models", ",".join(map(str, fim_pair)), "--ctx", "1024", "--prompt", PREFIX, "--suffix", SUFFIX,
              "--temperature", "0", "--max-tokens", "16", "--json")  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["completions"][0]["text"] == own.text


def test_every_route_that_fills_in_the_middle_takes_the_layout(fim_server, fim_pair):
    """`infill_layout` on /infill, Ollama's options and OpenAI's extra body: the library's text;
    on /infill a keystroke that types the suggestion's first tokens evaluates one prompt token."""
    with Ensemble.load(fim_pair, n_ctx=1024) as ens:
        own = ens.generate(Infill(PREFIX, SUFFIX), max_tokens=16, temperature=0, infill_layout="cached")
        assert own.text != ens.generate(Infill(PREFIX, SUFFIX), max_tokens=16, temperature=0).text  # the layout changes the middle
    got = ollama.Client(host=fim_server.url).generate("fim", PREFIX, suffix=SUFFIX, options={"temperature": 0, "num_predict": 16, "infill_layout": "cached"})
    openai_text = fim_server.client().completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0,
                                                         extra_body={"infill_layout": "cached"}).choices[0].text  # fmt: skip
    assert got.response == openai_text == own.text
    before = TYPED + " "  # the cursor after a word: the suggestion's tokens are those the tokenizer cuts, typed
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": before, "n_predict": 8, "temperature": 0, "infill_layout": "cached",
            "return_tokens": True}  # fmt: skip
    first = _infill(fim_server, body).json()
    vocab, budget = Model(fim_pair[0], vocab_only=True), Budget(512, 4096, 8)
    prompt = fim_prompt(vocab, Infill(PREFIX, SUFFIX, before), budget, "cached")
    typed = before + _typed_through(vocab, prompt.cursor.healed, first["tokens"], 3)
    now = fim_prompt(vocab, Infill(PREFIX, SUFFIX, typed), budget, "cached").tokens
    cells = prompt.tokens + first["tokens"][:-1]  # the last token written was never evaluated
    assert cells[: len(now)] == now and typed != before  # the case: the cells hold the new prompt
    second = _infill(fim_server, {**body, "prompt": typed}).json()
    assert second["timings"]["prompt_n"] == 1 < first["timings"]["prompt_n"]
    assert second["content"].startswith(first["content"][len(typed) - len(before) :])
    assert second["localcos"]["held_accepted"] == min(len(cells) - len(now), 7) > 0


def test_bad_infill_input_is_one_line_or_a_400(fim_server, models, tmp_path):
    bad = [
        ({"input_prefix": 5, "input_suffix": ""}, "input_prefix"),
        ({"input_suffix": ""}, "input_prefix"),
        ({"input_prefix": "", "input_suffix": "", "samplers": ["dry"]}, "samplers"),
        ({"input_prefix": "", "input_suffix": "", "n_cmpl": 0}, "n_cmpl"),
        ({"input_prefix": "", "input_suffix": "", "lora": [{"id": 0, "scale": 0.5}]}, "lora"),
        ({"input_prefix": "", "input_suffix": "", "model": "other"}, "model"),
        ({"input_prefix": "", "input_suffix": "", "infill_layout": "sideways"}, "infill_layout"),
    ]
    for body, param in bad:
        r = _infill(fim_server, body)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, (body, r.text)
    r = httpx.post(fim_server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "suffix": "y"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    r = httpx.post(fim_server.url + "/v1/completions", json={"prompt": [1, 2, 3], "suffix": "y"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    r = httpx.post(fim_server.url + "/api/generate", json={"model": "fim", "prompt": "x", "suffix": "y", "system": "z"}, timeout=30)
    assert r.status_code == 400 and "system" in r.json()["error"]
    # a model without FIM tokens: one line naming it
    proc = run("generate", "--models", str(models["base"]), "--prompt", "a", "--suffix", "b", "--max-tokens", "2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "t-base has no fill-in-the-middle" in proc.stderr, proc.stderr
    for args, message in ((["--suffix", "b", "--chat"], "not a chat"), (["--suffix-file", str(tmp_path / "none.py")], "no such file"),
                          (["--context-file", str(tmp_path)], "give --suffix"),
                          (["--suffix", "b", "--level", "byte", "--infill-layout", "cached"], "not available at the byte level")):  # fmt: skip
        proc = run("generate", "--models", str(models["fim"]), "--prompt", "a", *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_a_server_without_fim_tokens_answers_infill_with_a_400_naming_the_model(models):
    with serving(["--models", str(models["base"]), "--ctx", "512"]) as server:
        r = _infill(server, {"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 400 and "t-base has no fill-in-the-middle" in r.json()["error"]["message"]
        show = ollama.Client(host=server.url).show(server_model(server))
        assert ".Suffix" not in (show.template or "") and "insert" not in show.capabilities


def server_model(server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


# --- eval's infilling tasks -------------------------------------------------------------------------------


def test_humaneval_infilling_tasks_are_built_as_released_and_their_canonical_middles_pass():
    single, multi, spans = (infilling_tasks(k) for k in ("humaneval-single-line", "humaneval-multi-line", "humaneval-random-span"))
    assert (len(single), len(multi), len(spans)) == (1033, 5815, 1640)
    first = single[0]
    assert first.task_id == "SingleLineInfilling/HumanEval/0/L0" and first.prompt.endswith('"""\n\n')  # as human-eval-infilling wrote it
    assert first.suffix.startswith("        for idx2, elem2 in enumerate(numbers):\n")
    middle = "    for idx, elem in enumerate(numbers):\n"
    assert run_program(first.program(middle), Limits(10, 1024), "namespaces").passed
    assert not run_program(first.program("    for idx, elem in enumerate(numbers[1:]):\n"), Limits(10, 1024), "namespaces").passed
    assert spans == infilling_tasks("humaneval-random-span")  # seeded: the same draw every time


def test_the_cursor_benchmark_types_each_solutions_middle_line_up_to_a_character_inside_it():
    """benchmarks/infill_cursor.py's problems: the typed part and the line's rest put back make the
    canonical program, the cursor inside the line's code; the same cuts every run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("infill_cursor", Path(__file__).parents[1] / "benchmarks" / "infill_cursor.py")
    assert spec is not None and spec.loader is not None
    bench = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up there
    spec.loader.exec_module(bench)
    found = bench.cursors()
    problems = humaneval_problems()
    assert len(found) == len(problems) == 164
    for c, problem in zip(found, problems):
        line = c.task.suffix.partition("\n")[0]
        assert line == "" and c.task.prompt == c.above + c.typed  # the line's end is what the model writes
        written = problem["prompt"] + problem["canonical_solution"]
        start = len(c.above)
        whole = written[start : written.index("\n", start)]
        assert whole.startswith(c.typed) and c.typed.strip() and len(c.typed) < len(whole.rstrip())
        assert c.above + whole + c.rest == written and c.indent == len(whole) - len(whole.lstrip())
    assert [c.typed for c in bench.cursors()] == [c.typed for c in found]


def test_eval_runs_infilling_tasks_through_the_fim_prompt(fim_pair, tmp_path):
    released = tmp_path / "infill.jsonl"
    tasks = infilling_tasks("humaneval-single-line")[:2]
    released.write_text("".join(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "suffix": t.suffix, "canonical_solution": "",
                                            "test": t.test, "entry_point": t.entry_point}) + "\n" for t in tasks))  # fmt: skip
    assert load_tasks(str(released))[1] == tasks
    results = tmp_path / "r.jsonl"
    proc = run("eval", "--models", ",".join(map(str, fim_pair)), "--task", str(released), "--run-code", "--timeout", "2", "--max-tokens", "8",
               "--results", str(results), "--variant", "alone=--weights 0,1 --method ensemble",
               "--variant", "sd=--weights 0,1 --method sd --gamma 2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    assert len(records) == 4 and {r["config"] for r in records} == {"alone", "sd"}
    by = {(r["config"], r["task_id"]): r["completion"] for r in records}
    with Ensemble.load(fim_pair, n_ctx=4096) as ens:
        for t in tasks:
            own = ens.generate(Infill(t.prompt, t.suffix), combiner=WeightedEnsemble([0, 1]), method="ensemble", temperature=0, max_tokens=8)
            assert by[("alone", t.task_id)] == by[("sd", t.task_id)] == own.text  # synthetic F32: sd's greedy text is the model's
    refused = run("eval", "--models", str(fim_pair[0]), "--task", str(released), "--run-code", "--variant", "x=--phrasing instruct")
    assert refused.returncode == 2 and "FIM tokens" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr


# --- the trained pair ------------------------------------------------------------------------------------


@pytest.mark.real
def test_sd_with_the_0_5b_drafting_fills_in_the_1_5bs_middle(trained):
    """The 0.5B drafting for the 1.5B (weights 0,1: r is the 1.5B's own distribution) writes the
    1.5B's greedy middle, up to llama.cpp's batch noise: where the two part, the 1.5B's top two
    were within the band the rows of the two runs measured apart."""
    from test_trained import r_scores, score_gap_bound

    from localcos import GenerationConfig
    from localcos.infill import infill_prompt
    from localcos.testing.rows import RowLog

    pair = [trained("coder-0.5b"), trained("coder-1.5b")]
    tasks = infilling_tasks("humaneval-single-line")[3:6]  # of problem 0 (the choosing split)
    rows, partings = RowLog(), []
    with Ensemble.load(pair, WeightedEnsemble([0, 1]), n_ctx=1024) as ens:
        for t in tasks:
            with rows.recording(f"alone {t.task_id}"):
                alone = ens.generate(t.infill, method="ensemble", temperature=0, max_tokens=16)
            with rows.recording(f"sd {t.task_id}"):
                sd = checked(ens).generate(t.infill, method="sd", gamma=4, temperature=0, max_tokens=16)
            assert sd.stats.proposed > 0 and alone.stats.models[0].calls == 0  # the 0.5B drafts in sd, and is never run alone
            if sd.token_ids != alone.token_ids:
                i = next((j for j, (a, b) in enumerate(zip(sd.token_ids, alone.token_ids)) if a != b), min(len(sd.token_ids), len(alone.token_ids)))
                partings.append((t, i, alone.token_ids, sd.token_ids, infill_prompt(ens.models[1], t.infill, GenerationConfig(max_tokens=16)).tokens))
    for t, i, want, got, prompt in partings:
        noise = rows.noise(f"alone {t.task_id}", f"sd {t.task_id}")
        scores = r_scores(pair[1:], WeightedEnsemble([1]).bind(1, [1]), prompt + want[:i])
        gap = float(scores[want[i]] - scores[got[i]])
        assert abs(gap) <= score_gap_bound("we", [noise.get(str(pair[1]), 0.0)]), (t.task_id, i, gap, noise)
    assert len(partings) <= 1, [p[0].task_id for p in partings]


@pytest.mark.real
def test_llama_vims_request_on_the_trained_model_ends_its_middle_as_llama_server_would(trained):
    """A llama.vim request inside a function body: the middle keeps to the cursor's block
    (n_indent), and says why it ended."""
    prefix = "import math\n\n\ndef circle_area(radius):\n"
    suffix = "\n\ndef square_area(side):\n    return side * side\n"
    with serving(["--models", str(trained("coder-1.5b")), "--ctx", "1024"]) as server:
        body = {**VIM, "input_prefix": prefix, "prompt": "    ", "input_suffix": suffix, "input_extra": [], "n_indent": 4, "n_predict": 48,
                "seed": 1, "response_fields": None}  # fmt: skip
        answer = _infill(server, body).json()
        assert answer["stop_type"] in ("eos", "limit") and answer["content"].strip()
        lines = answer["content"].split("\n")
        assert all(line == "" or line.startswith("    ") or line.startswith("\t") for line in lines[1:]), answer["content"]
        # greedy: after llama-server's repository header the 1.5B writes on past the middle (docs/editors.md),
        # and n_indent cuts it at the first line outside the function's body; the makers' plain FIM prompt
        # (OpenAI's suffix) ends it with the model's own end token
        cut = _infill(server, {"input_prefix": prefix, "prompt": "    ", "input_suffix": suffix, "temperature": 0, "n_predict": 48,
                               "n_indent": 4}).json()  # fmt: skip
        assert cut["stop_type"] == "limit" and cut["content"].startswith("return math.pi") and cut["content"].count("\n") == 1, cut
        plain = server.client().completions.create(model=server_model(server), prompt=prefix + "    ", suffix=suffix, max_tokens=48, temperature=0)
        assert plain.choices[0].text.startswith(cut["content"].rstrip("\n")) and plain.choices[0].finish_reason == "stop", plain


@pytest.mark.real
def test_the_cursors_token_healed_on_the_trained_model(trained):
    """The 1.5B, greedy, both healed layouts, the cursor after indentation, inside a word and
    after a multi-byte character: the middle's first tokens write the healed bytes (the model's
    own cut of the text at the cursor: `    ` + ` pi`, `urn`), and the text is what follows
    them (the cached layout heals back to the word's start: ` retu`, `"Zoë`); inside `retu` both
    finish the word."""
    cursors = [("def area(radius):\n    ", "\n\n\nprint(area(2))\n"), ("def area(radius):\n    retu", "\n\n\nprint(area(2))\n"),
               ('def greet():\n    return "Zoë', "\n")]  # fmt: skip
    with Ensemble.load([trained("coder-1.5b")], n_ctx=1024) as ens:
        m = ens.models[0]
        for layout in ("makers-healed", "cached"):
            for prefix, suffix in cursors:
                healed = fim_prompt(m, Infill(prefix, suffix), Budget(m.n_batch, m.n_ctx, 12), layout).cursor.healed
                if layout == "makers-healed":
                    assert healed == m.piece(m.tokenize(prefix, add_bos=False)[-1])
                else:  # the word before the cursor, and no more than white space before it
                    assert healed.decode().lstrip() == re.search(r"\w*$", prefix).group(), healed
                out = ens.generate(Infill(prefix, suffix), max_tokens=12, temperature=0, infill_layout=layout)
                written = b"".join(m.piece(t) for t in out.token_ids or [])
                assert written.startswith(healed) and len(healed) >= (2 if "ë" in prefix else 1), (layout, prefix, written)
                assert out.text == written[len(healed) :].decode(errors="replace")[: len(out.text)] and out.text, (layout, prefix, out.text)
        for layout in ("makers-healed", "cached"):
            assert ens.generate(Infill(*cursors[1]), max_tokens=12, temperature=0, infill_layout=layout).text.startswith("rn "), layout
