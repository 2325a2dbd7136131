"""The shape of the code, checked: a request travels one way, each rule and message has one owner.

1. The import graph of localcos/ (imports inside functions included) has no cycle; nothing under
   runtime/ or core/ imports the `Ensemble` facade; the product never imports localcos.testing;
   backend/ imports nothing above it and runtime/ no front end; outside runtime/ no branch asks
   whether models are byte-level models (they say their level), a level is asked a question only
   where what it means is written (the runtime, `core.level`, `config.levels`) and at the few
   listed places where it is a module's business, and the server, the chat and eval name no byte-level type; the front ends load
   models by level only through `ensemble.load_at`.
2. Errors are routed by their type, `param` and `code`, never by their text: no `... in str(e)`;
   every `ConfigError` names its setting (`param`).
3. Every user-facing error message is written in one file.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import localcos

PACKAGE = Path(localcos.__file__).resolve().parent
ROOT = PACKAGE.parent
ERRORS = {"LocalcosError", "ModelFileError", "ModelHeaderError", "IncompleteModelError", "StorageError", "TokenizerMismatchError",
          "ConfigError", "PromptTooLongError", "ModelNotAvailableError", "RpcUnavailableError", "RemoteError", "APIError",
          "SdistUnavailable", "SandboxUnavailable", "StoreError"}  # fmt: skip


def _modules() -> dict[str, Path]:
    """localcos's modules by dotted name (the chat app lives in tui/ and installs as localcos.tui)."""
    out = {}
    for base, prefix in ((PACKAGE, "localcos"), (ROOT / "tui", "localcos.tui")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block: imports for the type checker, none at run time."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(name: str, path: Path) -> set[str]:
    """The localcos modules `name` imports at run time, at any depth of its code."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block) for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_the_runtime_and_the_core_do_not_know_the_facade_and_the_product_not_the_tests():
    for module, targets in GRAPH.items():
        if module.startswith(("localcos.runtime", "localcos.core")):
            assert "localcos.ensemble" not in targets, f"{module} imports the Ensemble facade"
        if not module.startswith("localcos.testing"):
            assert not any(t.startswith("localcos.testing") for t in targets), f"{module} imports test code"
    # the layers: the core imports no llama.cpp layer, config no runtime
    for module, targets in GRAPH.items():
        if module.startswith("localcos.core"):
            assert not any(t.startswith(("localcos.backend", "localcos.runtime", "localcos.config")) for t in targets), module
        if module.startswith("localcos.config"):
            assert not any(t.startswith(("localcos.runtime", "localcos.server", "localcos.cli")) for t in targets), module


def test_the_backend_imports_nothing_above_it_and_the_runtime_no_front_end():
    below_backend = ("localcos.backend", "localcos.errors", "localcos.paths", "localcos.files")
    front_ends = ("localcos.cli", "localcos.server", "localcos.tui", "localcos.eval", "localcos.tools", "localcos.scoring",
                  "localcos.ensemble", "localcos.chat")  # fmt: skip
    for module, targets in GRAPH.items():
        if module.startswith("localcos.backend"):
            assert all(t.startswith(below_backend) for t in targets), f"{module} imports {sorted(targets)}"
        if module.startswith("localcos.runtime"):
            assert not any(t.startswith(front_ends) for t in targets), f"{module} imports a front end: {sorted(targets)}"


def test_outside_the_runtime_no_branch_asks_whether_models_are_byte_level_models():
    """The loaded models say their level (`models.level`); an isinstance check on a byte-level
    type outside runtime/ only narrows a type for the checker (an assert), never picks a branch."""
    for module, path in MODULES.items():
        if module.startswith("localcos.runtime"):
            continue
        tree = ast.parse(path.read_text())
        asserted = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assert) for n in ast.walk(a)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                byte = [k.id for k in kinds if isinstance(k, ast.Name) and k.id.startswith("Byte")]
                assert not byte or id(node) in asserted, f"{module}:{node.lineno}: isinstance(..., {byte[0]}) picks a branch; read models.level"


# outside the runtime and the level modules, the places where a level is a module's own business
# (each such line says why in a comment)
FRONT_END_LEVEL_BRANCHES = {
    "localcos.ensemble": "load_at: which runtime holds the models (the one load by level)",
    "localcos.chat": "chat_templates: one template for one vocabulary, each model's own otherwise",
    "localcos.cli.score": "the byte level's scorer (bits per byte, each model on its own tokens) is its own",
    "localcos.stats": "how each level's statistics read for people",
    "localcos.eval.configs": "default_configs: one model alone, and at the run's level where that is not its own tokens",
}
# where what a level means is written: the level itself and its facts, and the rules of the settings
LEVEL_MODULES = ("localcos.core.level", "localcos.config.levels")
# the types whose isinstance check would pick a branch by level: the plans, templates and loaded models of each
LEVEL_TYPES = {"Plan", "BytePlan", "ChatFormatter", "OwnTemplates", "LoadedModels", "ByteModels", "Ensemble", "ByteEnsemble"}


def _is_level(node: ast.AST) -> bool:
    """`Level.X`."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Level"


def _level_branches(tree: ast.AST) -> list[int]:
    """The lines that ask a level a question: `.in_bytes`, a comparison with `Level.X` (also in a
    tuple or set it is compared against), a table keyed by `Level` (a dict of `Level.X` keys, an
    annotation `dict[Level, ...]`), or an `isinstance` on a level's type (`LEVEL_TYPES`) that
    picks a branch (one in an assert only narrows a type for the checker)."""
    asserted = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assert) for n in ast.walk(a)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "in_bytes":
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            items = [e for o in operands if isinstance(o, (ast.Tuple, ast.Set, ast.List)) for e in o.elts]
            if any(_is_level(o) for o in operands + items):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and _is_level(k) for k in node.keys):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "dict":
            first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
            if isinstance(first, ast.Name) and first.id == "Level":
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(isinstance(k, ast.Name) and k.id in LEVEL_TYPES for k in kinds) and id(node) not in asserted:
                lines.append(node.lineno)
    return sorted(set(lines))


def test_the_level_is_asked_only_where_it_is_written_and_at_the_listed_places():
    """What a level means lives in the runtime and the level modules; elsewhere at most five
    modules ask a level a question, once each, saying why. The front ends hold the models as
    `runtime.models.LevelViews` and ask it which models decode a request and what renders it."""
    assert len(FRONT_END_LEVEL_BRANCHES) <= 5
    found = {}
    for module, path in MODULES.items():
        if module.startswith("localcos.runtime") or module in LEVEL_MODULES:
            continue
        source = path.read_text().splitlines()
        branches = _level_branches(ast.parse("\n".join(source)))
        if branches:
            found[module] = branches
        if module not in FRONT_END_LEVEL_BRANCHES:
            continue
        assert len(branches) == 1, f"{module}: {FRONT_END_LEVEL_BRANCHES[module]}: one branch, found lines {branches}"
        line = branches[0]
        assert any("#" in source[i - 1] for i in range(max(1, line - 2), line + 1)), f"{module}:{line}: say why the level is this module's business"
    unlisted = {m: lines for m, lines in found.items() if m not in FRONT_END_LEVEL_BRANCHES}
    assert not unlisted, f"asks which level it is (the models and the level modules say): {unlisted}"


def test_the_server_the_chat_and_eval_name_no_byte_level_type():
    """They hold loaded models as `runtime.models.Models`, plans as `LevelPlan`, streams as the
    one `runtime.run.Stream`: what a level does is the runtime's."""
    for module, path in MODULES.items():
        if not module.startswith(("localcos.server", "localcos.tui", "localcos.eval")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and "runtime" in node.module:
                named = [a.name for a in node.names if a.name.startswith("Byte")]
                assert not named, f"{module}:{node.lineno}: imports {named[0]}"


# the front ends that load models of one tokenizer by construction, so at the token level only
SINGLE_LEVEL_LOADS = {
    "localcos.cli.demo": "the synthetic demo pair, written with one tokenizer",
    "localcos.cli.models": "quantize's check: the quantised file beside its source, one tokenizer",
}


def test_front_ends_load_models_by_level_only_through_load_at():
    """`ensemble.load_at` is the one load by level: outside the runtime and the facade, no front
    end loads a level's models itself (`from_spec`, `ByteModels.load`), but where its models have
    one tokenizer by construction (listed)."""
    loads = collections.defaultdict(list)
    for module, path in MODULES.items():
        if module.startswith(("localcos.runtime", "localcos.ensemble")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                owner, method = node.func.value.id, node.func.attr
                if method == "from_spec" or (owner.startswith("Byte") and method == "load"):
                    loads[module].append(node.lineno)
    assert set(loads) == set(SINGLE_LEVEL_LOADS), dict(loads)


def _calls(name: str):
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) == name:
                    yield module, node


def test_errors_are_never_routed_by_their_text():
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        caught = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}

        def is_message(node: ast.AST) -> bool:  # the text of an exception caught here: str(e), or an f-string of it
            if isinstance(node, ast.JoinedStr):
                return any(isinstance(v, ast.FormattedValue) and (is_message(v.value) or (isinstance(v.value, ast.Name) and v.value.id in caught))
                           for v in node.values)  # fmt: skip
            return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and len(node.args) == 1
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in caught)  # fmt: skip

        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):  # in, not in, ==, != on either side
                assert not any(is_message(side) for side in [node.left, *node.comparators]), f"{module}:{node.lineno} routes on an exception's text"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("endswith", "startswith", "find", "index", "count"):
                    assert not is_message(node.func.value), f"{module}:{node.lineno} routes on an exception's text"
                if node.func.attr in ("search", "match", "fullmatch", "findall", "finditer"):  # re.search(pattern, str(e))
                    assert not any(is_message(a) for a in node.args), f"{module}:{node.lineno} routes on an exception's text"


def test_every_config_error_names_its_setting():
    calls = list(_calls("ConfigError"))
    assert len(calls) > 100
    for module, node in calls:
        named = len(node.args) >= 2 or any(k.arg == "param" for k in node.keywords)
        assert named, f"{module}:{node.lineno}: a ConfigError without its param"


def _template(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return None if left is None or right is None else left + right
    return None


def test_every_error_message_is_written_in_one_file():
    where: dict[str, set[str]] = collections.defaultdict(set)
    for name in ERRORS:
        for module, node in _calls(name):
            args = node.args[1:] if name == "APIError" else node.args
            text = _template(args[0]) if args else None
            if text and any(c.isalpha() for c in text.replace("{}", "")):
                where[text].add(module)
    assert len(where) > 150
    twice = {text: sorted(modules) for text, modules in where.items() if len(modules) > 1}
    assert not twice, twice
