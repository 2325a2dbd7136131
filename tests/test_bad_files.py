"""Bad files and full disks: every command answers in one line, the header reader reads nothing
without bounds, and nothing is left half-written.

Mutants (tests/mutants.py) of a synthetic model and of a trained one go through the header reader
in a child process under a 1 GiB address-space limit, and a sample of them through `models info`,
`models check` and `generate`: never a traceback, never a crash of llama.cpp, one line and exit 2
(1 for `info` on an incomplete file). Cache and output folders that cannot be written give one
line, exit 2, and no temporary file.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcos.backend import check_model_file, read_info
from localcos.errors import IncompleteModelError, ModelHeaderError, StorageError
from localcos.files import TEMP_PREFIX, atomic_path, atomic_write
from mutants import Patched, magic_and_noise, mutants

TESTS = Path(__file__).resolve().parent

READER = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[5])
from pathlib import Path
from localcos.backend import read_info
from localcos.errors import LocalcosError
from mutants import Patched, mutants

path, work, n, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cases = mutants(path, n, seed)
copy = Patched(path, work)
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a length read as gigabytes must not be allocated
outcomes = {}
for m in cases:
    saved = copy.apply(m)
    try:
        info = read_info(copy.path)
        outcome = "incomplete" if info.incomplete else "read"
    except LocalcosError as e:
        outcome = type(e).__name__
    except BaseException as e:
        outcome = "CRASH " + type(e).__name__ + ": " + str(e)[:200]
    copy.restore(m, saved)
    outcomes.setdefault(outcome, []).append(m.kind)
print(json.dumps(outcomes))
"""


def run_reader(path: Path, tmp_path: Path, n_flips: int, seed: int) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", READER, str(path), str(tmp_path / "mutant.gguf"), str(n_flips), str(seed), str(TESTS)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("which", ["synthetic", "trained"])
def test_the_header_reader_refuses_every_mutant_within_bounds(which, models, trained, tmp_path):
    """A few hundred seeded mutants: each is read, reported incomplete, or refused with the
    project's own error naming a field and its byte offset; none raises anything else or
    allocates past 1 GiB (absurd lengths are refused before they are read)."""
    path = models["base"] if which == "synthetic" else trained("smollm2-135m")
    outcomes = run_reader(path, tmp_path, 300 if which == "synthetic" else 150, seed=35)
    crashes = {k: v for k, v in outcomes.items() if k.startswith("CRASH")}
    assert not crashes, crashes
    refused = len(outcomes.get("ModelHeaderError", [])) + len(outcomes.get("ModelFileError", []))
    total = sum(len(v) for v in outcomes.values())
    assert refused >= total // 2, {k: len(v) for k, v in outcomes.items()}
    # every absurd length, count and tensor change is refused; cuts inside the data are incomplete
    read = set(outcomes.get("read", []))
    assert not {k for k in read if "= " in k and "first item" not in k}, read
    assert "a tensor too many" not in read and "a tensor too few" not in read
    assert not {k for k in read if k.startswith("cut")}, read


def test_a_damaged_header_names_the_field_and_its_offset(models, tmp_path):
    bad = tmp_path / "bad.gguf"
    data = bytearray(models["base"].read_bytes())
    data[24:32] = (1 << 63).to_bytes(8, "little")  # the first metadata key's length
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelHeaderError, match=r"the length of metadata key 0 at byte 24"):
        read_info(bad)
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(magic_and_noise(1))
    with pytest.raises(ModelHeaderError):
        check_model_file(noise)


def _one_line(proc: subprocess.CompletedProcess, codes: tuple[int, ...] = (2,)) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode in codes, (proc.returncode, proc.stderr[-1000:])
    # progress lines may come first ("building synthetic model ..."); the answer is one line
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("localcos: error:") or "incomplete:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


def localcos(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip


# runs a command and says its peak memory: getrusage's children here are that command's alone
MEASURED = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print('peak-kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)")  # fmt: skip


def measured(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """`localcos ARGS`, and its peak resident memory in MiB."""
    proc = subprocess.run([sys.executable, "-c", MEASURED, sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=300)
    *rest, last = proc.stderr.rstrip("\n").split("\n")
    assert last.startswith("peak-kib "), proc.stderr[-2000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, "\n".join(rest) + "\n"), int(last.split()[1]) / 1024


def test_commands_answer_mutants_of_a_trained_file_in_one_line(trained, tmp_path):
    """A sample of the mutants (every kind but most flips) through `models info`, `models check`
    and `generate`: exit 0 where the file still reads and loads, else one line and exit 2 (1 for
    `info` on an incomplete file); llama.cpp never sees a header the reader refused, so it never
    crashes; memory stays bounded."""
    source = trained("smollm2-135m")
    cases = [m for m in mutants(source, 2, seed=36) if m.kind == "flip" or "9223372036854775808" in m.kind
             or m.kind.startswith(("a tensor", "cut after the metadata count", "cut where the tensor data begins", "cut halfway"))]  # fmt: skip
    copy = Patched(source, tmp_path / "m.gguf")
    answered = {}
    peaks = []
    for m in cases:
        saved = copy.apply(m)
        try:
            f = str(copy.path)
            (info, a), (check, b), (gen, c) = (measured("models", "info", f, "--no-profile"), measured("models", "check", f"{f},{f}"),
                                               measured("generate", "--models", f"{f},{f}", "-p", "Hi", "--max-tokens", "2", "--ctx", "64"))  # fmt: skip
            peaks += [a, b, c]
            if info.returncode != 0:
                answered[m.kind] = _one_line(info, (1, 2) if m.cut is not None else (2,))
            if check.returncode != 0:
                _one_line(check)
            if gen.returncode != 0:
                _one_line(gen)
            assert (check.returncode == 0) == (gen.returncode == 0 or "cannot load" in gen.stderr), (m.kind, check.stderr, gen.stderr)
        finally:
            copy.restore(m, saved)
    # no mutant makes a command allocate what an absurd length asks for: each stays near the model's own size
    assert max(peaks) < 1024 + source.stat().st_size / 2**20, peaks
    assert any("damaged GGUF header" in line for line in answered.values()), answered


def test_a_truncated_download_is_incomplete_with_both_sizes(trained, tmp_path):
    source = trained("smollm2-135m")
    cut = tmp_path / "cut.gguf"
    with open(source, "rb") as f:
        cut.write_bytes(f.read(40_000_000))
    info = localcos("models", "info", str(cut), "--no-profile")
    assert info.returncode == 1 and "Traceback" not in info.stderr
    assert "quantization" in info.stdout  # the header it could read is printed
    line = _one_line(info, (1,))
    assert "incomplete" in line and "40.0 MB" in line and f"{source.stat().st_size / 1e6:.1f} MB" in line, line
    assert "incomplete" in _one_line(localcos("models", "check", f"{cut},{cut}"))
    assert "incomplete" in _one_line(localcos("generate", "--models", f"{cut},{cut}", "-p", "Hi", "--max-tokens", "1"))
    with pytest.raises(IncompleteModelError):
        check_model_file(cut)


def _no_temporaries(folder: Path) -> None:
    if folder.is_dir():
        left = [p for p in folder.rglob("*") if p.name.startswith((TEMP_PREFIX, ".fetch-"))]
        assert not left, left


def _small_tmpfs(where: Path) -> Path | None:
    """A 2 MiB tmpfs at `where` where this user may mount one (None elsewhere)."""
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return None
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    return where if proc.returncode == 0 else None


@pytest.fixture
def full_disk(tmp_path):
    mounted = _small_tmpfs(tmp_path / "full")
    yield mounted
    if mounted is not None:
        subprocess.run(["umount", str(mounted)], capture_output=True)


@pytest.mark.slow
def test_an_unusable_or_full_cache_is_one_line_and_leaves_nothing(tmp_path, full_disk):
    """`bench --synthetic`, `models pull` and the bench's outputs with the cache (or the output
    folder) below a regular file, and on a full disk where a tmpfs can be mounted: one line
    naming the path and the cause (and LOCALCOS_CACHE for the cache), exit 2, no temporary file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    below = {"LOCALCOS_CACHE": str(blocker / "cache")}
    line = _one_line(localcos("bench", "--synthetic", "we-pair", "--limit-prompts", "1", "--max-tokens", "4", env=below))
    assert str(blocker) in line and "not a folder" in line and "LOCALCOS_CACHE" in line, line
    line = _one_line(localcos("models", "pull", "smollm2-135m", env=below))
    assert str(blocker) in line and "LOCALCOS_CACHE" in line, line
    if full_disk is not None:
        env = {"LOCALCOS_CACHE": str(full_disk)}
        line = _one_line(localcos("bench", "--synthetic", "we-pair", "--limit-prompts", "1", "--max-tokens", "4", env=env))
        assert "the disk is full" in line and "LOCALCOS_CACHE" in line, line
        _no_temporaries(full_disk)
        line = _one_line(localcos("models", "pull", "smollm2-135m", env={**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)}))
        _no_temporaries(full_disk)


def test_bench_outputs_that_cannot_be_written_are_one_line(tmp_path, models):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for flag in ("--json", "--csv"):
        proc = localcos("bench", "--models", f"{models['base']},{models['sibling']}", "--methods", "ensemble", "--limit-prompts", "1",
                        "--max-tokens", "2", flag, str(blocker / "out"))  # fmt: skip
        line = _one_line(proc)
        assert str(blocker / "out") in line and "not a folder" in line, line


def test_atomic_writes_leave_nothing_behind_on_a_storage_fault(tmp_path, monkeypatch):
    """A write that fails midway (here: the disk fills as the file is renamed into place) leaves
    the old file as it was and no temporary file; the error is one line naming the target."""
    target = tmp_path / "out.json"
    target.write_text("old")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(StorageError, match=r"cannot write .*out.json: the disk is full"), atomic_write(target) as f:
        f.write("new")
    assert target.read_text() == "old"
    _no_temporaries(tmp_path)
    monkeypatch.undo()
    with pytest.raises(RuntimeError), atomic_path(target):  # any other failure: the temporary file goes too
        raise RuntimeError("interrupted")
    _no_temporaries(tmp_path)
    if os.geteuid() != 0:  # root writes anywhere: a folder without write permission stops only others
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(StorageError, match="permission denied"), atomic_write(locked / "x.txt") as f:
            f.write("x")
