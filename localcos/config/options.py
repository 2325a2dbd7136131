"""The options: each declared once, for every front end.

The command line's flags (`cli.options.add_options`), the chat's settings form, the server's
request fields and its own start-up options are all made from this table: an option's name (also
its JSON field), flags, group, help, default and parser (`config.parse`). Nothing else declares an
option or repeats its rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

from ..backend import MIN_CTX
from ..core.bytelevel import check_prune
from ..core.combiners import COMBINERS, check_gate, check_mu, check_plausibility, check_scale
from ..core.decoding import METHODS
from ..core.lookup import LOOKUP_MODES
from ..core.sampling import check_setting
from ..errors import ConfigError
from ..grammar import Constraint
from ..infill import INFILL_LAYOUTS
from ..models.weights import WEIGHT_TYPES
from .parse import (
    format_gamma,
    format_rpc,
    parse_bool,
    parse_choice,
    parse_combine,
    parse_float,
    parse_floats,
    parse_byte_gamma,
    parse_gamma,
    parse_grammar,
    parse_int,
    parse_ints,
    parse_json_schema,
    parse_lookahead,
    parse_name,
    parse_names,
    parse_ngram_sizes,
    parse_port,
    parse_prompt_text,
    parse_proposer,
    parse_refs,
    parse_samplers,
    parse_rpc,
    parse_seed,
    parse_strings,
    parse_text,
)

SPLIT_MODES = ("none", "layer", "row")
FLASH_ATTN = ("auto", "on", "off")
COMBINE_LEVELS = ("logits", "probs")
LEVELS = ("auto", "token", "byte", "mixed")
PHRASINGS = ("raw", "instruct", "evalplus", "auto")  # how a member reads a text prompt (localcos.phrasing)
CONTRAST_PROMPTS = ("drop-examples", "instruct")  # eval's second prompts, made from each task's (eval.contrast)
MAX_QUEUE = 64  # the server's default

# --- the options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option, declared once for every front end.

    `name` is the field in `Settings` values and the server's JSON; `flags` the command line's;
    `target` says which spec it feeds ("source": which models; "load", "combine", "generation",
    "chat", "server")
    and `attr` the spec's field. `parse(value, what)` checks a raw value.
    """

    name: str
    flags: tuple[str, ...]
    group: str
    target: str
    attr: str
    parse: Callable[[Any, str], Any]
    described: str | Callable[[], str]  # its help, or what makes it when it is read (the combiners' registry)
    default: Any = None
    metavar: str | None = None
    switch: bool = False  # a command-line flag without a value
    repeat: bool = False  # a command-line option given once per value
    choices: tuple[str, ...] | None = None
    # more than one model as its makers run it: a second model or prompt, a combination, a way of
    # drafting or looking ahead (what `Settings.alone` leaves out)
    combines: bool = False

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def help(self) -> str:
        """What `--help`, the chat's form and the docs say of it."""
        return self.described if isinstance(self.described, str) else self.described()

    def check(self, value: Any, *, json: bool = False) -> Any:
        """`value` parsed and checked; errors name the option (`ConfigError.param` = name)."""
        try:
            return self.parse(value, self.what(json))
        except ConfigError as e:
            e.param = self.name
            raise

    def what(self, json: bool = False) -> str:
        """How messages name the option: its JSON field (a request, the Python API) or its flag."""
        return self.name if json else self.flag

    def format(self, value: Any) -> str:
        """The text a person would type for `value` ("" for unset)."""
        if value is None:
            return ""
        if self.name == "gamma":
            return format_gamma(value)
        if self.name == "rpc":
            return format_rpc(value)
        if isinstance(value, Constraint):
            return value.source
        if isinstance(value, (list, tuple)):
            return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


def _option(name: str, flags: str | tuple[str, ...], group: str, target: str, parse: Callable[[Any, str], Any], help: str | Callable[[], str],
            **kw: Any) -> Option:  # fmt: skip
    attr = kw.pop("attr", name)
    return Option(name, (flags,) if isinstance(flags, str) else flags, group, target, attr, parse, help, **kw)


def _choice(choices: Sequence[str]) -> Callable[[Any, str], str]:
    return lambda v, what: parse_choice(v, what, choices)


def _sampling(name: str, parse: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """A sampling setting: its kind of number, then its range as the sampler defines it."""
    return lambda v, what: check_setting(name, parse(v, what), what)


def _at_least(minimum: int) -> Callable[[Any, str], int]:
    return lambda v, what: parse_int(v, what, minimum=minimum)


_OPTIONS = [
    # which models
    _option("models", ("--models", "-m"), "models", "source", parse_refs,
            "comma-separated models in ensemble order: GGUF paths, names from models.toml, hf:OWNER/REPO/FILE, or models other "
            "tools keep: ollama:MODEL[:TAG], lmstudio:PUBLISHER/REPO[/FILE] (see `localcos models list`)", metavar="A,B"),
    _option("preset", "--preset", "models", "source", parse_name, "a named ensemble from models.toml: its models, combiner, method and gamma", metavar="NAME"),
    _option("synthetic", "--synthetic", "models", "source", parse_name,
            "a built-in synthetic set: we-pair, cd-pair, we-triple, we-unrelated, we-pair-152k (built once, cached)", metavar="SET"),
    _option("synthetic_dtype", "--synthetic-dtype", "models", "source", _choice(WEIGHT_TYPES),
            "weight type of a synthetic set (default bf16: the cheapest batched verification on CPUs with BF16 instructions)",
            choices=WEIGHT_TYPES),
    _option("config", "--config", "models", "source", parse_name, "an extra models.toml (merged over the built-in and your own)", metavar="FILE"),
    # how to load them
    _option("ctx", "--ctx", "models", "load", _at_least(MIN_CTX), "context length per model", default=4096, attr="n_ctx", metavar="N"),
    _option("batch_size", "--batch-size", "models", "load", _at_least(1), "most tokens per llama_decode call", default=512, attr="n_batch", metavar="N"),
    _option("n_gpu_layers", "--n-gpu-layers", "hardware", "load", lambda v, what: parse_ints(v, what, minimum=-1),
            "layers to offload to the GPU: one value or one per model; -1 = all (default: models.toml, else 0)", metavar="N[,N]"),
    _option("main_gpu", "--main-gpu", "hardware", "load", _at_least(0), "GPU for the whole model when not splitting", default=0, metavar="I"),
    _option("split_mode", "--split-mode", "hardware", "load", _choice(SPLIT_MODES), "how to split a model across GPUs", default="layer", choices=SPLIT_MODES),
    _option("flash_attn", "--flash-attn", "hardware", "load", _choice(FLASH_ATTN), "flash attention", default="auto", choices=FLASH_ATTN),
    _option("rpc", "--rpc", "hardware", "load", parse_rpc,
            "where each model runs: - (here) or HOST:PORT of a `localcos rpc-server` (HOST:PORT+HOST:PORT for several); "
            "one entry or one per model (default: models.toml, else here). A remote model offloads all its layers "
            "unless --n-gpu-layers says otherwise", metavar="-|HOST:PORT[,...]"),
    _option("rpc_timeout", "--rpc-timeout", "hardware", "load", lambda v, what: parse_float(v, what, above=0),
            "seconds a model on an RPC server may take to answer one call before its server is taken as lost",
            default=120.0, metavar="S"),
    _option("threads", "--threads", "hardware", "load", _at_least(1), "CPU threads per model (default: physical cores)", attr="n_threads", metavar="N"),
    _option("parallel", "--parallel", "hardware", "load", _at_least(1),
            "sequences decoded at once, their rows sharing llama_decode calls (generate --n, concurrent server requests); "
            "each takes --ctx tokens of KV cache (default: serve and generate --n choose from the context size, else 1)",
            metavar="N"),
    _option("verbose", "--verbose", "hardware", "load", parse_bool, "show llama.cpp's own log lines", default=False, switch=True),
    _option("calibrate", "--calibrate", "hardware", "load", parse_bool,
            "measure what batched llama_decode calls cost on this machine again, instead of using the cached profile",
            default=False, switch=True),
    # how to combine
    _option("combine", "--combine", "combination", "combine", parse_combine,
            lambda: "; ".join(f"{k.name}: {k.help}" for k in COMBINERS.values()) + "; or FILE.py:FUNCTION (your function)", default="we",
            metavar="KIND", combines=True),
    _option("weights", "--weights", "combination", "combine", lambda v, what: parse_floats(v, what),
            "we / logit-mix weights, one per model (default: equal)", metavar="W,W", combines=True),
    _option("mu", "--mu", "combination", "combine", lambda v, what: check_mu(parse_float(v, what), what),
            "cd: the amateur's weight mu", default=0.1, combines=True),
    _option("plausibility", "--plausibility", "combination", "combine", lambda v, what: check_plausibility(parse_float(v, what), what),
            "cd: plausibility threshold alpha in (0, 1] (default off)", metavar="ALPHA", combines=True),
    _option("expert", "--expert", "combination", "combine", _at_least(0), "cd: index of the expert model (default: the larger)", metavar="I", combines=True),
    _option("gate", "--gate", "combination", "combine", lambda v, what: check_gate(parse_float(v, what), what),
            "combine only where the lead model is unsure: where its top probability is at least P, r is its own "
            "distribution and the other models are not evaluated (0 < P <= 1; default: combine at every token)", metavar="P", combines=True),
    _option("lead", "--lead", "combination", "combine", _at_least(0),
            "--gate: index of the model that decides alone where it is sure (default: cd's expert, else the model with "
            "the most parameters)", metavar="I", combines=True),
    _option("cfg_scale", "--cfg-scale", "combination", "combine", lambda v, what: check_scale(parse_float(v, what), what),
            "guidance (--combine cfg, which this option alone chooses): r = softmax(l_neg + S (l_pos - l_neg)), the model "
            "reading the prompt against itself reading --negative-prompt; 1 is the model alone, above 1 toward what the prompt "
            "adds (0 < S <= 20)", attr="scale", metavar="S", combines=True),
    _option("combine_level", "--combine-level", "combination", "combine", _choice(COMBINE_LEVELS),
            "custom combiner: what FUNCTION receives", default="logits", attr="combine_on", choices=COMBINE_LEVELS, combines=True),
    # the level models are combined at
    _option("level", "--level", "level", "load", _choice(LEVELS),
            "combine next-token distributions (token: one tokenizer; for one model llama.cpp's own decoding) or next-byte "
            "distributions (byte: any tokenizers, each model in its own tokens); mixed: whole tokens of the lead where its "
            "likeliest has probability --gate or more (one model: --gate 0.5 unless given), the byte level elsewhere; "
            "auto (the default): token when the models share a tokenizer (one model: its own tokens, as llama.cpp decodes "
            "them), else byte",
            default="auto", choices=LEVELS),
    _option("byte_paths", "--byte-paths", "level", "load", _at_least(1),
            "byte level: the most tokenisations of the text each model keeps (its llama.cpp sequences)", default=8, metavar="N"),
    _option("byte_prune", "--byte-prune", "level", "load", lambda v, what: check_prune(parse_float(v, what), what),
            "byte level: drop a tokenisation whose mass is below this fraction of the largest, and fold one into the heaviest "
            "at the same position when its mass times how far their predictions differ (total variation) is below it; "
            "0 keeps all (exact, slower)",
            default=0.01, metavar="P"),
    _option("byte_gamma", "--byte-gamma", "level", "generation", parse_byte_gamma,
            "byte level, --method cos: bytes each proposer drafts (the others score them in one call), or auto: planned each "
            "round from the models' measured call costs, no draft where drafts would not pay (default auto)", default="auto", metavar="N|auto", combines=True),
    # how to generate
    _option("method", "--method", "method", "generation", _choice(METHODS),
            "ensemble (every model, every token), sd, naive-cos, or cos (default: cos; ensemble for one model)", choices=METHODS, combines=True),
    _option("gamma", "--gamma", "method", "generation", parse_gamma,
            "proposal length: auto (the default): before each draft, the proposer and length that the models' call costs "
            "(measured once when they load, and cached) and the acceptance seen so far in this generation say are fastest, "
            "or no draft where drafts would not pay (a drafter the combination does not use reads its prompt only once "
            "its drafts are expected to repay it); it depends on nothing timed during the run, so a seed gives one text. "
            "Or a fixed length: one value (the proposer's; others 1), or one per model",
            default="auto", metavar="G", combines=True),
    _option("proposer", "--proposer", "method", "generation", parse_proposer,
            "index of the default proposer (default: the cheapest model), or lookup: drafts looked up in the context only",
            metavar="I|lookup", combines=True),
    _option("lookup", "--lookup", "method", "generation", _choice(LOOKUP_MODES),
            "cos also verifies drafts looked up in the context (no model call; their rows ride in the calls made anyway): "
            "on, off, or auto (only when their rows are expected to cost less than the tokens they save)", default="auto",
            choices=LOOKUP_MODES, combines=True),
    _option("lookup_ngram", "--lookup-ngram", "method", "generation", parse_ngram_sizes,
            "the shortest and the longest suffix of the text looked up earlier in it", default=(3, 12), metavar="MIN,MAX", combines=True),
    _option("lookup_tokens", "--lookup-tokens", "method", "generation", _at_least(1), "the most looked-up tokens one draft takes",
            default=16, metavar="N", combines=True),
    _option("lookahead", "--lookahead", "method", "generation", parse_lookahead,
            "greedy decoding that looks ahead where r is unsure (its top probability below --lookahead-threshold): the K "
            "likeliest tokens each rolled out L tokens greedily, side by side in one call of K rows per model and step, and "
            "the branch whose tokens r finds likeliest on average kept, its rolled-out tokens included (temperature 0, "
            "method ensemble, the token level; off by default)", metavar="K,L", combines=True),
    _option("lookahead_threshold", "--lookahead-threshold", "method", "generation",
            lambda v, what: parse_float(v, what, above=0, maximum=1),
            "--lookahead: r's top probability below which a position is looked ahead from (0 < P <= 1)", default=0.5, metavar="P", combines=True),
    _option("temperature", ("--temperature", "-t"), "sampling", "generation", _sampling("temperature", parse_float),
            "0 = greedy", default=1.0, metavar="T"),
    _option("top_k", "--top-k", "sampling", "generation", _sampling("top_k", parse_int), "keep the k most likely tokens; 0 = off", default=0, metavar="K"),
    _option("top_p", "--top-p", "sampling", "generation", _sampling("top_p", parse_float),
            "nucleus sampling; 1 = off", default=1.0, metavar="P"),
    _option("min_p", "--min-p", "sampling", "generation", _sampling("min_p", parse_float),
            "drop tokens below min-p x the most likely one; 0 = off", default=0.0, metavar="P"),
    _option("samplers", "--samplers", "sampling", "generation", parse_samplers,
            "the sampler chain, as llama-server names it (top_k;top_p;infill, or kpi): only the samplers named apply, each "
            "at its setting, the others off (temperature unnamed: 1); infill is llama.cpp's fill-in-the-middle sampler, "
            "which editors' plugins ask for (default: temperature, top_k, top_p and min_p, each at its setting)",
            metavar="NAMES"),
    _option("seed", "--seed", "sampling", "generation", parse_seed, "random seed; -1 = random (printed in the stats)", metavar="N"),
    _option("max_tokens", "--max-tokens", "output", "generation", _at_least(1), "tokens to generate at most", default=128, metavar="N"),
    _option("stop", "--stop", "output", "generation", parse_strings, "stop at this string (repeatable)", default=(), repeat=True, metavar="STR"),
    _option("negative_prompt", "--negative-prompt", "combination", "generation", parse_prompt_text,
            "a second prompt the lead model also reads, as a member of its own (its weights and its calls shared): the negative "
            "of guidance (--cfg-scale), what --combine cd contrasts the prompt with, or a second phrasing --combine we averages; "
            "with --chat, the user's message it stands for", metavar="TEXT", combines=True),
    _option("phrasing", "--phrasing", "output", "generation", _choice(PHRASINGS),
            "how the models read a text prompt: raw (as it is); or, for code to complete, through the chat template: "
            "instruct (\"Complete this Python function.\", the assistant's turn repeating the code and going on from it, as a "
            "completion would), evalplus (EvalPlus's instruction, which model cards report with: the model writes a whole "
            "self-contained script), auto (as the model's makers run it: instruct where its GGUF has a chat template, raw "
            "where not; eval's default)",
            default="raw", choices=PHRASINGS),
    _option("n_indent", "--n-indent", "output", "generation", _at_least(0),
            "a new line indented by fewer than N spaces or tabs ends the text at its first character (an editor sends its "
            "cursor line's indentation, as llama-server's n_indent); 0 = off", default=0, metavar="N"),
    _option("t_max_predict_ms", "--t-max-predict-ms", "output", "generation", lambda v, what: max(parse_float(v, what), 0.0),
            "after MS milliseconds of generating, the next new line ends the text (an editor's latency budget, as llama-server's "
            "t_max_predict_ms; the text then depends on this machine's speed); 0 or less = off", default=0.0, metavar="MS"),
    _option("cache_prompt", "--cache-prompt", "output", "generation", parse_bool,
            "a prompt reuses the cells the models hold of it from an earlier request and is evaluated from where it differs, "
            "as llama-server's cache_prompt (its /infill's default): faster for an editor's requests, but its text may then "
            "depend on what ran before, as llama.cpp rounds calls of other shapes differently (default: each prompt is "
            "evaluated as a fresh process evaluates it, so one seed gives one text)", default=False, switch=True),
    _option("infill_suffix", "--infill-suffix", "output", "generation", _at_least(0),
            "fill-in-the-middle: the most tokens of the suffix read after the cursor (default: llama-server's: a quarter of "
            "--batch-size less 2 and the typed part's tokens; the prefix's last three quarters of --batch-size are read)",
            metavar="N"),
    _option("infill_layout", "--infill-layout", "output", "generation", _choice(INFILL_LAYOUTS),
            "fill-in-the-middle: how the prompt is laid out: makers (the models' makers' order, prefix, suffix, middle, as "
            "llama-server and Ollama lay it out), makers-healed (the same with the cursor's token healed: taken back, and the "
            "middle made to begin with its bytes in tokens the model chooses), cached (the prefix up to the cursor's block of "
            "lines, the suffix, then the cursor's block, which the model goes on from, the cursor's word healed: with the last "
            "request's cells kept (--cache-prompt, /infill's default) a keystroke then evaluates only what was typed, and the "
            "suffix is read again only when a new block begins, about every 4 lines; a middle that runs into the suffix ends "
            "where the suffix begins)", default="makers", choices=INFILL_LAYOUTS),
    _option("infill_block", "--infill-block", "output", "generation", _at_least(1),
            "fill-in-the-middle, --infill-layout cached: a prefix longer than its budget starts at the first line of a block "
            "(a block is about N lines, its first lines chosen by their text), so its start moves about once every N lines as "
            "an editor's window of lines slides down the file", default=16, metavar="N"),
    _option("ignore_eos", "--ignore-eos", "output", "generation", parse_bool, "never stop at (or sample) end-of-generation tokens",
            default=False, switch=True),
    _option("json_schema", "--json-schema", "output", "generation", parse_json_schema,
            "structured output: only JSON valid under this schema (a file, or the schema itself)", metavar="FILE|JSON"),
    _option("grammar", "--grammar", "output", "generation", parse_grammar,
            "structured output: only text of this GBNF grammar, llama.cpp's format (a file, or the grammar itself)", metavar="FILE|GBNF"),
    _option("json_object", "--json-object", "output", "generation", parse_bool, "structured output: one JSON object, any",
            default=False, switch=True),
    # eval: a configuration's second prompt, made from each task's (a --variant's flag)
    _option("contrast_prompt", "--contrast-prompt", "eval", "eval", _choice(CONTRAST_PROMPTS),
            "a second prompt made from each task's, read by a second member of the lead model: drop-examples (the task "
            "without its examples: >>> lines, Example blocks, MBPP's assert) or instruct (the task as a chat instruction, the "
            "code repeated in the assistant's turn); combined as --combine says (cfg with --cfg-scale, cd, we)",
            choices=CONTRAST_PROMPTS, combines=True),
    # chat formatting
    _option("chat_template_model", "--chat-template-model", "chat", "chat", _at_least(0),
            "index of the model whose chat template formats messages (default: the preset's, else 0)", metavar="I"),
    _option("system", "--system", "chat", "chat", parse_text, "system message", metavar="TEXT"),
    _option("guide_system", "--guide-system", "chat", "chat", parse_bool,
            "guidance toward the system message: a second member of the lead model reads the conversation without it "
            "(with --cfg-scale, or --combine cd)", default=False, switch=True, combines=True),
    # the server (localcos serve)
    _option("host", "--host", "server", "server", parse_name, "address to listen on (127.0.0.1: this machine only)", default="127.0.0.1"),
    _option("port", "--port", "server", "server", parse_port, "port (0: any free one)", default=8080),
    _option("api_key", "--api-key", "server", "server", parse_name,
            "require this key (Authorization: Bearer KEY); or set LOCALCOS_API_KEY", metavar="KEY"),
    _option("max_queue", "--max-queue", "server", "server", _at_least(0),
            "requests that may wait; more get 503 with Retry-After", default=MAX_QUEUE, metavar="N"),
    _option("alias", "--alias", "server", "server", parse_name,
            "the model name clients use (default: the preset's name, else the models')", metavar="NAME"),
    _option("cors", "--cors", "server", "server", parse_names,
            "let web pages at ORIGIN (e.g. http://localhost:3000) call the server; repeatable or comma-separated, * for any "
            "(default: none; a request from any other page's Origin is refused with 403)", default=(), repeat=True, metavar="ORIGIN"),
    _option("allowed_hosts", "--allowed-hosts", "server", "server", parse_names,
            "also answer requests whose Host header is NAME (the server's DNS name behind a proxy or on the LAN); "
            "repeatable or comma-separated, * for any (default: only the listening address, localhost, 127.0.0.1 and [::1]: "
            "other Host headers are refused with 403, which stops DNS-rebinding pages)", default=(), repeat=True, metavar="NAME"),
]
OPTIONS: dict[str, Option] = {o.name: o for o in _OPTIONS}
GROUPS: dict[str, list[Option]] = {}
for _o in _OPTIONS:
    GROUPS.setdefault(_o.group, []).append(_o)

