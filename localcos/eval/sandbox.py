"""Running a program a model wrote (`localcos eval --run-code`): each in a boundary the kernel
enforces, in a temporary folder of its own that is deleted afterwards, under limits.

The boundary (`CONTAINED`, the default; Linux on x86_64, aarch64 and riscv64) is built from
namespaces and a system-call filter, as bubblewrap and container runtimes build theirs, by a
launcher (`launcher.py`, run by path) started for each program:
- a user namespace: the program runs as an unprivileged user with no capabilities (`nobody`
  when localcos runs as root; the user's own id otherwise), with no new privileges (setuid
  bits do nothing) and a keyring of its own;
- a mount namespace whose root is a new, read-only file system holding only what Python needs
  (/usr, /lib*, /bin, the Python installation, a few /dev nodes), each mounted read-only, and
  the program's folder, the one place it may write (/sandbox: a file system of its own in
  memory, of bounded size and number of files, gone with the namespace). Nothing else exists
  there: not the home folder, /etc, /tmp, /proc, other users' files, the user's projects;
- a PID namespace whose process 1 is eval's own init (`launcher.py`), which handles no signal
  (so none from inside reaches it): the program is its child,
  a process like any other (a signal it sends itself ends it); when the init ends, the kernel
  kills every process of the namespace, `setsid` or not, and no process there can see or signal
  one outside. The init dies with the launcher, the launcher with eval (parent-death signals the
  program cannot clear: they are not its own), so nothing of a run outlives eval however eval
  ends; the harness kills the init by a pidfd at the end and at the timeout and waits until it
  is gone: nothing of the program runs once `run_program` has returned. A scratch folder or
  cgroup that a killed eval left is removed the next time a program runs (`_sweep`);
- a network namespace with no interface up, an IPC namespace and a UTS namespace of its own;
- a seccomp filter (`launcher.seccomp_filter`), an allow list: only Unix sockets (the network
  namespace does not isolate AF_VSOCK, the way to a virtual machine's host), no namespaces of
  its own, no System V or POSIX IPC, memfd or io_uring (memory held outside the address space's
  limit), socket buffers and pipes at the system's default sizes (kernel memory the address
  space does not count), no ptrace of another process, nothing that watches, locks or probes
  the host's files bound into the box, no upcall to the kernel's helpers;
- the kernel's limits on each process (`resource`): address space, CPU time (SIGXCPU, then
  SIGKILL a second later), the size of a file it writes, open files, processes, message queues,
  locked memory, no core dumps; and a wall-clock timeout;
- where a memory cgroup can be had (`memcg`: as root, or in a delegated cgroup), one of the
  run's own bounding the memory of all its processes together, kernel memory included.

What is bounded, then: the program's processes (16, each of `memory_mb` address space, and all
of them `memory_mb` where a cgroup can be had), what it writes (its folder's size and files), what
it can open and reach. What is not: CPU time across its processes beyond each one's limit within
the timeout; without a cgroup, memory for the processes as a whole (see docs/evaluation.md).

`UNCONTAINED` ("--sandbox none", asked for by name) runs the program with the same limits and
timeout but without the namespaces: it can read, write and connect wherever its user can.

The verdict is judged outside the program's process: the program runs in a process of its own
and answers calls; its test runs in another, the judge's, forked by eval's init (the same
boundary), with the task's own code, and calls the program's functions with plain data, taking
plain data back (`crossing`: no object of the program's reaches the test); the judge holds no
capability, has the box's environment, works in the read-only root, and its limits are out of
the program's reach. A program passes
when the test's last statement returned in the judge's process, as eval's init hears from that
process id, which the kernel vouches for (launcher.py). Exiting early in any form
(`sys.exit(0)`, `os._exit(0)`, `unittest.main()`, a thread or an atexit hook that exits) is a
failure with its reason; an always-equal value, a swapped `check`, a helper defined again or the
verdict's channel sought by descriptor decide nothing. The program's output reaches the harness
only through pipes the harness owns: standard output is discarded, the last `_KEPT_OUTPUT` bytes
of standard error are kept for the one line that says why it failed where the judge did not say.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import platform
import re
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cache

from ..errors import ConfigError
from . import memcg

CONTAINED = "namespaces"
UNCONTAINED = "none"
SANDBOXES = (CONTAINED, UNCONTAINED)

_KEPT_OUTPUT = 64 * 1024  # bytes of stderr kept (the end of a traceback is what matters)
_NOBODY = 65534  # the overflow id: the user a root launcher's program runs as
_SCRATCH_PREFIX = "localcos-eval-"  # then this process's id: what a killed eval left is found by it
_SCRATCH = re.compile(re.escape(_SCRATCH_PREFIX) + r"(\d+)-")

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")  # run by path: see its docstring
_CROSSING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crossing.py")  # read by the launcher
_WAIT_FOR_END = 10.0  # seconds the harness waits for a killed program's namespace to be gone

_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")


class SandboxUnavailable(ConfigError):
    """The boundary cannot be built on this system (another OS, namespaces refused)."""


@dataclass(frozen=True)
class Limits:
    """What a program may use."""

    seconds: float = 10.0  # wall clock
    memory_mb: int = 1024  # address space, of each of its processes
    file_mb: int = 16  # the largest file it may write
    folder_mb: int = 64  # what its folder may hold in all (contained: a file system in memory, one inode per 4 KiB)
    open_files: int = 64
    processes: int = 16  # processes of its user (in its own user namespace when contained)
    cpu_seconds: int | None = None  # CPU time of each process; None: the wall clock's, rounded up, plus one

    @property
    def cpu(self) -> int:
        """The CPU seconds at which a process gets SIGXCPU (SIGKILL one second later)."""
        return self.cpu_seconds if self.cpu_seconds is not None else int(self.seconds) + 1


@dataclass(frozen=True)
class Program:
    """What runs: the model's code (`source`, in a process of its own) and, judging it from
    another (`crossing`), the test: it passes when the test's last statement returns. `context`
    is the task's own code the test may use (its prompt: helpers the test calls), run by the
    judge, never taken from the program; every other name the test reads and does not define
    is the program's, the entry point always. Without a test, a program passes when its last
    statement returned."""

    source: str
    test: str | None = None
    context: str = ""
    entry_point: str | None = None


@dataclass(frozen=True)
class Outcome:
    """How a program ended: passed (its last statement returned), or one line saying why not."""

    passed: bool
    result: str
    seconds: float


def python_paths() -> tuple[str, tuple[str, ...]]:
    """(the base interpreter, the folders it needs): the programs run the Python installation
    this one is based on (its standard library; not a virtual environment's packages)."""
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    folders = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    folders.add(os.path.dirname(os.path.dirname(python)))
    return python, tuple(sorted(f for f in folders if not any(f == s or f.startswith(s + "/") for s in ("/", *_SYSTEM))))


@cache
def unavailable(sandbox: str = CONTAINED) -> str | None:
    """Why `sandbox` cannot run programs here (one line), or None. Checked once per process by
    running a program that must pass."""
    if sandbox == UNCONTAINED:
        return None
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces, and this system is {platform.system()}"
    from .launcher import ARCHITECTURES

    if platform.machine() not in ARCHITECTURES:
        return f"the sandbox's system-call filter does not know this processor architecture ({platform.machine()})"
    try:
        outcome = _run_checked(Program("pass\n"), Limits(seconds=10.0), sandbox)
    except _SetupFailed as e:
        return str(e)
    return None if outcome.passed else f"a trivial program did not pass in the sandbox ({outcome.result})"


def require(sandbox: str) -> None:
    """Raise SandboxUnavailable (one line: what is missing, how to proceed) unless `sandbox` can
    run programs here."""
    why = unavailable(sandbox)
    if why is not None:
        raise SandboxUnavailable(
            f"--run-code cannot contain the programs: {why}. Allow unprivileged user namespaces (Debian: sysctl "
            "kernel.unprivileged_userns_clone=1; Ubuntu 24.04: sysctl kernel.apparmor_restrict_unprivileged_userns=0), or "
            "run eval in a virtual machine with --sandbox none (the programs then run NOT contained, as your user)",
            param="sandbox",
        )


def run_program(program: Program | str, limits: Limits = Limits(), sandbox: str = CONTAINED) -> Outcome:
    """Run `program` (a Program, or the source of one with no test) in a temporary folder of its own, inside `sandbox` (see
    the module's docstring); the folder is deleted afterwards, and no process of the program is
    left when this returns. Refuses with SandboxUnavailable where the boundary cannot be built.
    Building it for one program is tried twice (a fork or a mount can fail for a moment on a
    loaded machine); failing twice, it is the system's failure, not the program's: raised. The
    building ends before the program's first instruction: nothing a program does raises."""
    require(sandbox)
    _sweep()
    if isinstance(program, str):
        program = Program(program)
    try:
        return _run_checked(program, limits, sandbox)
    except _SetupFailed:
        pass
    try:
        return _run_checked(program, limits, sandbox)
    except _SetupFailed as e:  # it worked for the first program: say so, do not score it
        raise SandboxUnavailable(f"the sandbox could not be built for a program, twice: {e}", param="sandbox") from None


def memory_bound(limits: Limits) -> str:
    """What bounds a program's memory here, in words (eval says it before the first program)."""
    per_process = f"{limits.memory_mb} MiB of address space per process"
    place = memcg.hierarchy()
    if place is None:
        return per_process + " (no memory cgroup can be had here: not the program's processes together)"
    return f"{per_process}, and {limits.memory_mb} MiB for all of them together (a memory cgroup of each run's own, cgroup v{place.version})"


class _SetupFailed(Exception):
    pass


@cache
def _sweep() -> None:
    """Once per process: remove what runs of an eval that was killed left (its scratch folders,
    its memory cgroups), named after a process that no longer exists."""
    temp = tempfile.gettempdir()
    try:
        names = os.listdir(temp)
    except OSError:
        names = []
    for name in names:
        left = _SCRATCH.match(name)
        path = os.path.join(temp, name)
        try:
            mine = os.lstat(path).st_uid == os.geteuid()
        except OSError:
            continue
        if left and mine and not memcg.alive(int(left.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    memcg.sweep()


def _run_checked(program: Program, limits: Limits, sandbox: str) -> Outcome:
    scratch = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")
    group = None
    try:
        folder = os.path.join(scratch, "program")
        new_root = os.path.join(scratch, "root")
        os.mkdir(folder, 0o700)
        os.mkdir(new_root, 0o700)
        with open(os.path.join(folder, "program.py"), "w", encoding="utf-8") as f:
            f.write(program.source)
        with open(os.path.join(folder, "judge.marshal"), "wb") as f:
            f.write(marshal.dumps({"test": program.test, "context": program.context, "entry_point": program.entry_point}))
        try:
            group = memcg.make(limits.memory_mb << 20)
        except OSError as e:
            raise _SetupFailed(f"making the run's memory cgroup: {e.strerror}") from None
        return _run(folder, new_root, limits, sandbox, os.geteuid() == 0, group)
    finally:
        if group is not None:
            group.remove()
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class _Heard:
    """What came back from one program: the end of its stderr, and on the launcher's channel a
    setup failure, the pidfd whose end ends the program, and once the verdict is known (see
    launcher.py) how the program's process and the judge's ended (wait status and CPU seconds;
    the program's None where it had not), whether the test passed, and the judge's line where
    the test failed."""

    stderr: bytearray = field(default_factory=bytearray)
    setup: str | None = None
    pidfd: int | None = None
    ended: bool = False
    status: int | None = None
    cpu: float = 0.0
    judge_status: int = 0
    judge_cpu: float = 0.0
    returned: bool = False
    failed: str = ""
    timed_out: bool = False


def _run(folder: str, new_root: str, limits: Limits, sandbox: str, root: bool, group: memcg.Cgroup | None) -> Outcome:
    python, prefixes = python_paths()
    contained = sandbox == CONTAINED
    inside = "/sandbox" if contained else folder
    # the box's environment: the program's, the judge's (the launcher starts with it), the init's
    env = {"PATH": "/usr/bin:/bin", "HOME": inside, "TMPDIR": inside, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    config = {
        "contain": contained, "root": root, "folder": folder, "new_root": new_root, "python": python, "harness": os.getpid(),
        "uid": _NOBODY if root else os.geteuid(), "gid": _NOBODY if root else os.getegid(),
        "read_only": [*_SYSTEM, *prefixes], "devices": list(_DEVICES), "cgroup": None if group is None else group.folder,
        "memory_mb": limits.memory_mb, "folder_mb": limits.folder_mb, "cpu_seconds": limits.cpu, "file_mb": limits.file_mb,
        "open_files": limits.open_files, "processes": limits.processes, "crossing": _CROSSING, "nonce": secrets.token_hex(16),
        "env": env,
    }  # fmt: skip
    heard = _Heard()
    control, control_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = None
    t0 = time.monotonic()
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _LAUNCHER, marshal.dumps(config).hex(), str(control_theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(control_theirs.fileno(),), start_new_session=True, cwd="/", env=env,
            )  # fmt: skip
        finally:
            control_theirs.close()
        _collect(proc, control, t0 + limits.seconds, heard)
    finally:
        if proc is not None:
            _end(proc, control, heard)
        control.close()
        if heard.pidfd is not None:
            os.close(heard.pidfd)
    seconds = time.monotonic() - t0
    if heard.setup is not None:
        raise _SetupFailed(heard.setup)
    if heard.returned:
        return Outcome(True, "passed", seconds)
    if heard.timed_out:
        return Outcome(False, f"timed out after {limits.seconds:g}s", seconds)
    if group is not None and group.out_of_memory():
        return Outcome(False, f"out of memory (its processes held more than {limits.memory_mb} MiB in all)", seconds)
    if not heard.ended:  # the launcher ended without a word: its own exit status is all there is
        return Outcome(False, f"the sandbox's launcher ended with status {proc.returncode} before the program did", seconds)
    if heard.failed:  # the test failed, in the judge's words
        return Outcome(False, _said(heard.failed, limits), seconds)
    if heard.status is None or (os.WIFSIGNALED(heard.judge_status) and not os.WIFSIGNALED(heard.status)):
        return Outcome(False, _why(heard.judge_status, heard.judge_cpu, "", limits, "the test"), seconds)
    return Outcome(False, _why(heard.status, heard.cpu, heard.stderr.decode("utf-8", errors="replace"), limits), seconds)


def _collect(proc: subprocess.Popen, control: socket.socket, deadline: float, heard: _Heard) -> None:
    """Read the program's stderr and the launcher's channel as data arrives, bounded, until the
    launcher ends and the pipes are drained, or the deadline passes."""
    assert proc.stderr is not None
    err = proc.stderr.fileno()
    with selectors.DefaultSelector() as sel:
        for fd in (err, control.fileno()):
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                heard.timed_out = proc.poll() is None or not heard.ended
                return
            for key, _ in sel.select(min(left, 0.5)):
                if key.fd == control.fileno():
                    if not _hear(control, heard):
                        sel.unregister(key.fd)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                else:
                    heard.stderr += chunk
                    del heard.stderr[:-_KEPT_OUTPUT]
            if proc.poll() is not None and not sel.select(0):
                return  # ended; whatever it left holding the pipes (uncontained) is killed next


def _hear(control: socket.socket, heard: _Heard) -> bool:
    """One message of the launcher's (see launcher.py); False at its end."""
    message, fds, _, _ = socket.recv_fds(control, 4096, 4)
    for fd in fds:
        if message == b"program" and heard.pidfd is None:
            heard.pidfd = fd
        else:
            os.close(fd)
    if not message:
        return False
    text = message.decode("utf-8", "replace")
    if text.startswith("setup: ") and heard.setup is None:
        heard.setup = text[7:].strip()
    elif text.startswith("ended "):
        first, _, heard.failed = text.partition("\n")
        status, cpu, judge_status, judge_cpu, returned = first.split()[1:6]
        heard.status = None if status == "-" else int(status)
        heard.cpu, heard.judge_status, heard.judge_cpu = float(cpu), int(judge_status), float(judge_cpu)
        heard.returned, heard.ended = returned == "1", True
    return True


def _end(proc: subprocess.Popen, control: socket.socket, heard: _Heard) -> None:
    """Kill whatever is left: by its pidfd the process whose end ends the program (eval's init,
    process 1 of the program's PID namespace: the kernel kills the rest of the namespace with it),
    then the launcher's process group; and wait until that process is gone, so nothing of the
    program runs once this returns."""
    if heard.pidfd is None and not heard.ended and proc.poll() is None:
        # the pidfd may be on its way: a program started just before the deadline
        control.settimeout(0.05)
        try:
            while heard.pidfd is None and _hear(control, heard):
                pass
        except OSError:
            pass
    if heard.pidfd is not None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(heard.pidfd, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()
    if heard.pidfd is not None:  # readable once the process has ended
        select.select([heard.pidfd], [], [], _WAIT_FOR_END)


def _why(status: int, cpu: float, stderr: str, limits: Limits, whose: str = "its last statement") -> str:
    """One line for a program whose last statement (or test: `whose`) did not return, from its
    wait status, the CPU seconds it used and the end of its stderr."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        # a program that ignores or catches SIGXCPU: the kernel's SIGKILL at the hard limit ends it
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu + 1 - 0.05):
            return f"killed by {name}: the CPU limit (more than {limits.cpu}s of CPU)"
        if sig == signal.SIGXFSZ:
            return f"killed by {name}: wrote more than {limits.file_mb} MiB to a file"
        return f"killed by {name}"
    code = os.waitstatus_to_exitcode(status)
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return f"exited with status {code} before {whose} returned"
    return _said(lines[-1], limits)


def _said(last: str, limits: Limits) -> str:
    """One line for a program that failed, from the line that says why (a traceback's last)."""
    if last.startswith("MemoryError"):
        return f"out of memory (more than {limits.memory_mb} MiB)"
    last = "".join(c if c.isprintable() else "?" for c in last.strip())
    return "failed: " + (last[:200] + "..." if len(last) > 200 else last)
