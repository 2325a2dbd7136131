"""llama.cpp references in tests and benchmarks load models by the product's rules and run in a
child process: a fault in one fails that test, and the suite goes on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localcos.backend import Model, llamacpp
from localcos.backend.llamacpp import default_extra_buffers, default_threads
from localcos.testing import reference
from localcos.testing.reference import in_child


def test_a_reference_loads_models_by_the_products_rules(models, monkeypatch):
    path = str(models["q4"])  # a quantised model: what llama.cpp repacks into its extra buffers
    assert in_child(reference.loaded_params, path) == {"use_extra_bufts": default_extra_buffers(), "n_threads": default_threads()}
    for value, expected in (("0", False), ("1", True)):
        monkeypatch.setenv("LOCALCOS_EXTRA_BUFFERS", value)
        assert in_child(reference.loaded_params, path)["use_extra_bufts"] is expected
    monkeypatch.delenv("LOCALCOS_EXTRA_BUFFERS")
    # a CPU where llama.cpp would run its AMX kernels: no extra buffers for the product, its
    # references and llama.cpp's own tools alike
    monkeypatch.setattr(llamacpp, "amx_in_use", lambda: True)
    assert reference.loaded_params(path)["use_extra_bufts"] is False
    model = Model(path, n_ctx=64)
    assert model.extra_buffers is False
    model.close()
    assert reference.tool_args() == ["--no-repack"]
    monkeypatch.setattr(llamacpp, "amx_in_use", lambda: False)
    assert reference.loaded_params(path)["use_extra_bufts"] is True and reference.tool_args() == []


FAULTING = '''
import signal

from localcos.testing.reference import in_child


def test_a_reference_that_faults():
    in_child(signal.raise_signal, signal.SIGILL)  # as llama.cpp's AMX kernels fault on some CPUs


def test_the_next_one():
    assert in_child(sum, [1, 2]) == 3
'''


def test_a_faulting_child_fails_one_test_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_faulting.py").write_text(FAULTING)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_faulting.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]
    assert "raise_signal in a child process was killed by SIGILL" in proc.stdout
    assert "FAILED test_faulting.py::test_a_reference_that_faults" in proc.stdout


def test_the_noise_two_runs_measure_is_bounded_by_llama_cpps_band():
    """The trained tier's tolerance is the largest difference between two runs' rows after the
    same tokens; a row that is wrong (not noise) must fail, not widen the tolerance."""
    import numpy as np

    from localcos.testing.rows import BATCH_NOISE_BAND, RowLog

    rows = RowLog()
    rows.runs = {"a": {("m.gguf", (1, 2)): np.zeros(4)}, "b": {("m.gguf", (1, 2)): np.array([0.0, 0.3, 0.0, 0.0])}}
    assert rows.noise("a", "b") == {"m.gguf": 0.3}
    rows.runs["b"][("m.gguf", (1, 2))] = np.array([0.0, BATCH_NOISE_BAND + 1, 0.0, 0.0])
    with pytest.raises(AssertionError, match="more than llama.cpp's batch noise"):
        rows.noise("a", "b")
