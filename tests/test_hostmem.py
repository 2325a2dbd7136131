"""The decoding loop's vocabulary-sized arrays reuse the process's memory instead of faulting in
fresh pages every token (localcos.core.hostmem)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fakes import FakeModel
from localcos import Ensemble
from localcos.core import hostmem

# Make and drop arrays shaped like two 152k-vocabulary rows, as the decoder does every token, and
# count the minor page faults that costs.
FAULTS = """
import resource, sys, numpy as np
from localcos.core.hostmem import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    x = np.ones((2, 152000), np.float32); y = x * 2; del x, y
before = faults()
for _ in range(200):
    x = np.ones((2, 152000), np.float32); y = x * 2; z = y[0] + y[1]; del x, y, z
print(faults() - before)
"""


def page_faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "LOCALCOS_KEEP_MEMORY"}
    proc = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_kept_memory_removes_the_page_faults_of_each_token():
    # each of the 200 rounds touches ~2.9 MiB of arrays: ~150k page faults if none are reused
    default, kept = page_faults("default"), page_faults("keep")
    assert default > 20_000
    assert kept < default / 20


def test_an_ensemble_keeps_freed_memory(monkeypatch):
    calls = []
    monkeypatch.setattr("localcos.runtime.loaded.keep_freed_memory", lambda: calls.append(1) or True)
    Ensemble([FakeModel(seed=1), FakeModel(seed=2)])
    assert calls == [1]


def test_keep_memory_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("LOCALCOS_KEEP_MEMORY", "0")
    monkeypatch.setattr(hostmem, "_done", False)
    assert hostmem.keep_freed_memory() is False
