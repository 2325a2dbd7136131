"""Running a program a model wrote (`localcos eval --run-code`): each in its own Python process,
in a temporary folder of its own that is deleted afterwards, under limits.

What contains it:
- the kernel's limits on the process (`resource`): its address space (an allocation of gigabytes
  fails with MemoryError), its CPU time, the size of any file it writes, open files, no core
  dumps, and no new processes for an unprivileged user;
- a wall-clock timeout, after which its whole process group is killed (it runs in a session of
  its own, so anything it started goes too);
- Python's audit hooks (PEP 578), installed before its code runs and impossible to remove from
  Python: it may read anything, but writes, deletes, renames and links only inside its folder,
  and starts no process (fork, exec, spawn, system, subprocess), sends no signal, opens no
  socket and loads no native code through ctypes (which would get around the rest). What it
  is refused raises PermissionError in it, like any other failure.
- an environment of its own: no inherited variables (`python -I`), HOME and TMPDIR in its folder.

Its output is kept in files in its folder (bounded by the file-size limit) and read back with
invalid UTF-8 replaced. The outcome is one line: "passed", or why not.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# Runs in the child before the program: reads it, installs the hook, runs it as __main__. Its
# events: https://docs.python.org/3/library/audit_events.html
_GUARD = r"""
import os, sys
_folder = os.path.realpath(os.getcwd())
with open(sys.argv[1], encoding="utf-8") as _f:
    _source = _f.read()
_realpath, _fspath, _join = os.path.realpath, os.fspath, os.path.join
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_REFUSED = frozenset({
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn", "socket.__new__", "socket.connect", "socket.bind",
    "socket.sendto", "socket.sendmsg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
    "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at", "resource.setrlimit", "resource.prlimit",
    "sys.addaudithook", "os.setuid", "os.setgid", "os.chroot",
})
_PATHS = frozenset({
    "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate",
    "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.copyfile",
    "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.chown", "shutil.make_archive",
    "shutil.unpack_archive",
})


def _inside(path):
    if isinstance(path, int):
        return True  # an open file descriptor: it was opened under these rules
    real = _realpath(_join(_folder, _fspath(path)))
    return real == _folder or real.startswith(_folder + os.sep)


def _hook(event, args):
    if event in _REFUSED:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE)
        if writes and path is not None and not _inside(path):
            raise PermissionError(f"sandbox: writing {path} is not allowed (only inside the program's folder)")
    elif event in _PATHS:
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(arg):
                raise PermissionError(f"sandbox: {event} on {arg} is not allowed (only inside the program's folder)")


sys.addaudithook(_hook)
del _f
sys.argv = sys.argv[1:]
exec(compile(_source, "program.py", "exec"), {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__})
"""

_KEPT_OUTPUT = 64 * 1024  # bytes of stderr read back (the end of a traceback is what matters)


@dataclass(frozen=True)
class Limits:
    """What a program may use."""

    seconds: float = 10.0  # wall clock
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # the largest file it may write (its output included)
    open_files: int = 64


@dataclass(frozen=True)
class Outcome:
    """How a program ended: passed (exit status 0), or one line saying why not."""

    passed: bool
    result: str
    seconds: float


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run `source` as a Python program in a temporary folder of its own, contained (see the
    module's docstring); the folder is deleted afterwards."""
    folder = tempfile.mkdtemp(prefix="localcos-eval-")
    try:
        with open(os.path.join(folder, "program.py"), "w", encoding="utf-8") as f:
            f.write(source)
        return _run(folder, limits)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _limit(limits: Limits) -> None:
    """In the child, before it runs Python: the kernel's limits (hard, so it cannot raise them)."""
    mb = 1024 * 1024
    cpu = int(limits.seconds) + 1
    for what, value in (
        (resource.RLIMIT_AS, limits.memory_mb * mb),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, limits.file_mb * mb),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, 0),  # no new process (not enforced for root: the audit hook is)
    ):
        resource.setrlimit(what, (value, value))


def _run(folder: str, limits: Limits) -> Outcome:
    env = {"PATH": os.defpath, "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    t0 = time.monotonic()
    with open(os.path.join(folder, ".stdout"), "wb") as out, open(os.path.join(folder, ".stderr"), "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-X", "utf8", "-c", _GUARD, "program.py"],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True, preexec_fn=lambda: _limit(limits),
        )  # fmt: skip
        try:
            proc.wait(timeout=limits.seconds)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever it left running goes with it
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    seconds = time.monotonic() - t0
    if timed_out:
        return Outcome(False, f"timed out after {limits.seconds:g}s", seconds)
    code = proc.returncode
    if code == 0:
        return Outcome(True, "passed", seconds)
    return Outcome(False, _why(code, _tail(os.path.join(folder, ".stderr")), limits), seconds)


def _tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - _KEPT_OUTPUT))
        return f.read().decode("utf-8", errors="replace")


def _why(code: int, stderr: str, limits: Limits) -> str:
    """One line for a program that did not exit with status 0."""
    if code < 0:
        sig = -code
        if sig == signal.SIGXCPU:
            return f"used more than {int(limits.seconds) + 1}s of CPU"
        if sig == signal.SIGXFSZ:
            return f"wrote more than {limits.file_mb} MiB to a file"
        return f"killed by {signal.Signals(sig).name}" if sig in signal.valid_signals() else f"killed by signal {sig}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {code}"
    if last.startswith("MemoryError"):
        return f"out of memory (more than {limits.memory_mb} MiB)"
    last = "".join(c if c.isprintable() else "?" for c in last)
    return "failed: " + (last[:200] + "..." if len(last) > 200 else last)
