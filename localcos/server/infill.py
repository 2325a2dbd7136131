"""llama-server's `/infill` (`localcos serve`): completion at an editor's cursor, the route llama.vim
and llama.vscode call, over the same engine, settings and models as the other routes.

The body is llama-server's (`InfillRequest`): `input_prefix`, `input_suffix`, `input_extra`
({filename, text} chunks), `prompt` (the cursor's line up to the cursor: its tokens follow the
prefix's, as llama-server reads it), `n_predict`, `n_cmpl`, `n_indent`, `t_max_predict_ms`,
`samplers`, the sampling fields and every localcos option. The prompt is laid out as
llama-server lays it out, or in another layout (`infill_layout`: `localcos.infill`). The answer is llama-server's: `content`, `tokens`,
`stop`, `stop_type` (eos, word or limit), `stopping_word`, `timings` (prompt_n: the prompt's
tokens the models evaluated, the rest kept from an earlier request; predicted_n...),
`tokens_cached`, `tokens_evaluated`, `truncated`, with `response_fields` picking fields as
llama-server does; streamed as server-sent events of the same objects.

`cache_prompt`, true by default here as on llama-server, reuses the cells the models hold of the
prompt from an earlier request, evaluated from where it differs (in the makers' layout the
editor's next keystroke costs its suffix, not its prefix; in the cached one, what was typed), and
drafts what the cells hold after it where drafts are looked up (the last suggestion, its first
characters since typed: verified by the model, not answered for it); its text may then depend on
what ran before, as llama.cpp is not batch-invariant. Fields of llama-server's that change
nothing here are taken and do nothing, as they do in the llama-server localcos pins or because
localcos always does it: `id_slot` (a request shares the cells, and the row after them, of
whichever sequence holds the most of its prompt), `t_max_prompt_ms` (not read by that
llama-server either). One it does not implement (`lora`...) is refused.
"""

from __future__ import annotations

from typing import Annotated, Any
from collections.abc import Sequence

from pydantic import StrictBool, StrictStr

from ..config import OPTIONS
from ..infill import ExtraChunk, Infill
from . import protocol
from .protocol import ServedEnsemble
from .requests import MAX_CHOICES, SettingsFields, _Body, _integer, _neutral, _option


class ExtraChunkBody(_Body):
    """One of `input_extra`: another file's text (llama-server's default name: tmp)."""

    text: StrictStr
    filename: StrictStr = "tmp"
    time: float | None = None  # llama.vim's: when its ring buffer took the chunk (read by nobody)


class InfillRequest(SettingsFields):
    """POST /infill."""

    model: StrictStr | None = None  # llama.vim sends "" where none is set
    input_prefix: StrictStr
    input_suffix: StrictStr
    input_extra: list[ExtraChunkBody] = []
    prompt: StrictStr = ""  # the cursor's line up to the cursor
    n_predict: Annotated[int | None, _integer(-1)] = None  # -1: until an end or the context; 0: the prompt's cells only (a warm-up)
    n_cmpl: Annotated[int, _integer(1, MAX_CHOICES)] = 1
    stream: StrictBool = False
    n_indent: Annotated[int | None, _option("n_indent")] = None
    t_max_predict_ms: Annotated[float | None, _option("t_max_predict_ms")] = None
    samplers: Annotated[tuple[str, ...] | None, _option("samplers")] = None
    ignore_eos: Annotated[bool | None, _option("ignore_eos")] = None
    lookup: Annotated[str | None, _option("lookup")] = None
    infill_suffix: Annotated[int | None, _option("infill_suffix")] = None
    infill_layout: Annotated[str | None, _option("infill_layout")] = None
    infill_block: Annotated[int | None, _option("infill_block")] = None
    return_tokens: StrictBool = False
    response_fields: list[StrictStr] | None = None
    cache_prompt: Annotated[bool, _option("cache_prompt")] = True  # llama-server's default here: the cells of an earlier prompt reused
    # llama-server's fields that change nothing here (see the module's docstring)
    id_slot: int | None = None
    t_max_prompt_ms: float | None = None
    # llama-server's fields localcos does not implement: refused unless neutral
    lora: Annotated[list | None, _neutral([])] = None
    n_probs: Annotated[int | None, _neutral(0)] = None
    repeat_penalty: Annotated[float | None, _neutral(1, 1.0)] = None
    presence_penalty: Annotated[float | None, _neutral(0, 0.0)] = None
    frequency_penalty: Annotated[float | None, _neutral(0, 0.0)] = None

    def settings_values(self) -> dict[str, Any]:
        """The settings-layer options this request sets, parsed (for `Settings.with_values`);
        cache_prompt always (llama-server's default on this route is to reuse the cells)."""
        return {"cache_prompt": self.cache_prompt, **{name: getattr(self, name) for name in self.model_fields_set if name in OPTIONS}}

    @property
    def infill(self) -> Infill:
        return Infill(self.input_prefix, self.input_suffix, self.prompt, tuple(ExtraChunk(c.text, c.filename) for c in self.input_extra))


def plan_infill(served: ServedEnsemble, body: InfillRequest) -> protocol.Request:
    """POST /infill: the FIM prompt and settings of a validated body, at the level its settings
    decode at; `n_predict` 0 evaluates the prompt and generates nothing."""
    if body.model:
        protocol.check_model(served, body.model)
    # n_predict: -1 until an end or the context (no room then for extra chunks), 0 the prompt alone
    given = served.settings.generation.max_tokens if body.n_predict is None else body.n_predict
    max_tokens = served.ensemble.n_ctx if given < 0 else max(given, 1)
    settings = protocol.settings_for(served, body, max_tokens)
    models = served.decide(settings.generation, needs_tokens=False)
    plans = protocol.plans_of(models, settings, [body.infill], "input_prefix")
    if body.n_predict == 0:  # a warm-up: the prompt's cells, kept for the next request, and no text
        warm = [models.prefill_plan(p) for p in plans]
        if None in warm:  # these models begin every prompt afresh: nothing to warm
            return protocol.Request("infill", plans, [body.input_prefix], 1, body.stream, 0)
        plans = warm  # type: ignore[assignment]
    return protocol.Request("infill", plans, [body.input_prefix], body.n_cmpl, body.stream, max_tokens,
                            return_token_ids=body.return_tokens)  # fmt: skip


def stop_type(completion: Any) -> tuple[str, str]:
    """llama-server's stop_type and stopping_word of a completion: eos (an end token), word (a
    stop string), limit (n_predict, the context, n_indent or t_max_predict_ms)."""
    if completion is None:
        return "limit", ""
    if completion.stopped_by == "word":
        return "word", completion.stop_word or ""
    if completion.finish_reason == "stop":
        return "eos", ""
    return "limit", ""


def result(served: ServedEnsemble, request: protocol.Request, choice: protocol.Choice, fields: Sequence[str] | None) -> dict:
    """One choice's answer as llama-server writes it (`fields`: `response_fields`, each a name or a
    path such as timings/prompt_n)."""
    c = choice.completion
    stats = c.stats if c is not None else None
    plan = request.plans[choice.prompt]
    tokens = list(c.token_ids or []) if c is not None and request.return_token_ids else []
    return _body(served, choice.index, c.text if c is not None else "", tokens, stop_type(c), fields, protocol.statistics(request, [choice]),
                 n_prompt=plan.prompt_length,
                 evaluated=stats.prompt_evaluated if stats is not None else 0, predicted=c.length if c is not None else 0,
                 prompt_ms=(stats.prompt_seconds if stats else 0.0) * 1000, predicted_ms=(stats.seconds if stats else 0.0) * 1000)  # fmt: skip


def _body(served: ServedEnsemble, index: int, text: str, tokens: list[int], stop: tuple[str, str], fields: Sequence[str] | None,
          localcos: dict | None, n_prompt: int = 0, evaluated: int = 0, predicted: int = 0, prompt_ms: float = 0.0,
          predicted_ms: float = 0.0) -> dict:  # fmt: skip
    """llama-server's answer object, and its `response_fields` where given."""
    kind, word = stop
    body: dict[str, Any] = {
        "index": index, "content": text, "tokens": tokens, "id_slot": -1, "stop": True, "model": served.alias, "tokens_predicted": predicted,
        "tokens_evaluated": n_prompt, "has_new_line": "\n" in text, "truncated": False, "stop_type": kind, "stopping_word": word,
        "tokens_cached": n_prompt + predicted,
        "timings": {
            "cache_n": n_prompt - evaluated, "prompt_n": evaluated, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / evaluated if evaluated else 0.0, "prompt_per_second": evaluated / prompt_ms * 1000 if prompt_ms else 0.0,
            "predicted_n": predicted, "predicted_ms": predicted_ms, "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
            "predicted_per_second": predicted / predicted_ms * 1000 if predicted_ms else 0.0,
        },
        "localcos": localcos,
    }  # fmt: skip
    return {name: _field(body, name) for name in fields} if fields else body


def _field(body: dict, path: str) -> Any:
    """A field of the answer by llama-server's path (a/b); None where there is none."""
    value: Any = body
    for part in path.split("/"):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def answer(served: ServedEnsemble, request: protocol.Request, choices: Sequence[protocol.Choice], fields: Sequence[str] | None) -> Any:
    """The whole answer: one object, or a list of them for n_cmpl > 1 (as llama-server answers)."""
    out = [result(served, request, c, fields) for c in choices]
    return out[0] if len(out) == 1 else out


def piece(index: int, text: str, predicted: int) -> dict:
    """One streamed event: a piece of the middle."""
    return {"index": index, "content": text, "tokens": [], "stop": False, "id_slot": -1, "tokens_predicted": predicted, "tokens_evaluated": 0}

