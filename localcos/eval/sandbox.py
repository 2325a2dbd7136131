"""Running a program a model wrote (`localcos eval --run-code`): each in a boundary the kernel
enforces, in a temporary folder of its own that is deleted afterwards, under limits.

The boundary (`CONTAINED`, the default; Linux only) is built from namespaces, as bubblewrap and
container runtimes build theirs, by a small launcher (`_LAUNCHER`) started for each program:
- a user namespace: the program runs as an unprivileged user with no capabilities (`nobody`
  when localcos runs as root; the user's own id otherwise), with no new privileges (setuid
  bits do nothing) and a keyring of its own;
- a mount namespace whose root is a new, read-only file system holding only what Python needs
  (/usr, /lib*, /bin, the Python installation, a few /dev nodes), each mounted read-only, and
  the program's folder, the one place it may write (/sandbox: a file system of its own in
  memory, of bounded size, gone with the namespace). Nothing else exists there: not the home
  folder, /etc, /tmp, /proc, other users' files, the user's projects;
- a PID namespace in which the program is process 1: when it ends, the kernel kills every
  process it started, `setsid` or not, and it can neither see nor signal any process outside;
- a network namespace with no interface up (no connection to anything, 127.0.0.1 included), an
  IPC namespace and a UTS namespace of its own;
- the kernel's limits on the process (`resource`): address space, CPU time, the size of a file
  it writes, open files, processes, no core dumps; and a wall-clock timeout, after which the
  launcher's process group is killed (and the namespace with it).

`UNCONTAINED` ("--sandbox none", asked for by name) runs the program with the same limits and
timeout but without the namespaces: it can read, write and connect wherever its user can.

The verdict comes from a channel the program cannot fake by accident: the program runs under a
driver (`_DRIVER`) that writes a per-run nonce to a pipe the harness owns after the program's
last statement returned (for a code task: `check(candidate)`). Exiting early in any form
(`sys.exit(0)`, `os._exit(0)`, `unittest.main()`, a thread or an atexit hook that exits) is a
failure with its reason. A program written to forge the nonce is out of scope: it is the
boundary, not the verdict, that holds against hostile code. The program's output reaches the
harness only through pipes the harness owns: standard output is discarded, the last
`_KEPT_OUTPUT` bytes of standard error are kept for the one line that says why it failed.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

from ..errors import ConfigError

CONTAINED = "namespaces"
UNCONTAINED = "none"
SANDBOXES = (CONTAINED, UNCONTAINED)

_KEPT_OUTPUT = 64 * 1024  # bytes of stderr kept (the end of a traceback is what matters)
_SETUP_FAILED = 125  # the launcher's exit status when it could not build the boundary
_NOBODY = 65534  # the overflow id: the user a root launcher's program runs as

# pivot_root(2) and keyctl(2) have no C library wrapper: their numbers on each architecture
_SYSCALLS = {
    "x86_64": (155, 250), "aarch64": (41, 219), "arm64": (41, 219), "riscv64": (41, 219),
    "ppc64le": (203, 311), "s390x": (217, 280), "i686": (217, 288), "armv7l": (218, 311),
}  # fmt: skip

# Runs as `python -I -S -c _LAUNCHER CONFIG STATUS_FD`. As the parent (P) it forks the child (C),
# which enters new namespaces; P writes C's id maps (only a process outside may map root to
# nobody); C builds the new root, forks the program's process (G, process 1 of the new PID
# namespace), which drops to the unprivileged user and executes the driver. Setup errors are
# one line on STATUS_FD ("setup: ...") and exit status 125.
_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
status = int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)

def fail(what):
    os.write(status, ("setup: " + what + "\n").encode())
    os._exit(125)

def check(result, what):
    if result != 0:
        fail(what + ": " + os.strerror(ctypes.get_errno()))

def limit():
    mb = 1 << 20
    for what, value in ((resource.RLIMIT_AS, cfg["memory_mb"] * mb), (resource.RLIMIT_CPU, cfg["cpu_seconds"]),
                        (resource.RLIMIT_FSIZE, cfg["file_mb"] * mb), (resource.RLIMIT_NOFILE, cfg["open_files"]),
                        (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, cfg["processes"])):
        resource.setrlimit(what, (value, value))

def exit_like(code):
    # end as the process waited for ended: its exit status, or killed by its signal
    if os.WIFSIGNALED(code):
        signal.signal(os.WTERMSIG(code), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(code))
    os._exit(os.waitstatus_to_exitcode(code) if not os.WIFSIGNALED(code) else 128 + os.WTERMSIG(code))

def run_driver():
    limit()
    os.execve(cfg["python"], [cfg["python"], "-I", "-X", "utf8", "-c", cfg["driver"], cfg["nonce"], str(status)], cfg["env"])

resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if not cfg["contain"]:
    os.chdir(cfg["folder"])
    run_driver()

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | (1 << 12)  # and noatime, nodiratime, relatime
MNT_DETACH = 2
uid, gid = cfg["uid"], cfg["gid"]
up_read, up_write = os.pipe()  # C -> P: "u", C has its namespaces
down_read, down_write = os.pipe()  # P -> C: "g", the id maps are written
parent = os.getpid()
child = os.fork()
if child:
    # P: map C's ids once it has its user namespace, then wait for it
    os.close(up_write); os.close(down_read)
    if os.read(up_read, 1) == b"u":
        try:
            if cfg["root"]:
                maps = ("0 0 1\n%d %d 1\n" % (uid, uid), "0 0 1\n%d %d 1\n" % (gid, gid))
            else:
                with open("/proc/%d/setgroups" % child, "w") as f:
                    f.write("deny")
                maps = ("%d %d 1\n" % (uid, uid), "%d %d 1\n" % (gid, gid))
            for name, text in zip(("uid_map", "gid_map"), maps):
                with open("/proc/%d/%s" % (child, name), "w") as f:
                    f.write(text)
            os.write(down_write, b"g")
        except OSError as e:
            os.write(status, ("setup: writing the id maps: %s\n" % e.strerror).encode())
    os.close(down_write)
    exit_like(os.waitpid(child, 0)[1])

# C: new namespaces, then the new root
os.close(up_read); os.close(down_write)
check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
if os.getppid() != parent:
    os._exit(125)
check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
      "unshare(user, mount, pid, network, ipc, uts namespaces)")
os.write(up_write, b"u")
if os.read(down_read, 1) != b"g":
    os._exit(125)
os.close(up_write); os.close(down_read)

def mount(source, target, fstype, flags, data, what):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), what)

def bind(path, new, writable=False):
    target = new + path
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    mount(path, target, None, MS_BIND, None, "binding " + path)
    kept = os.statvfs(path).f_flag & KEPT_FLAGS  # a remount must keep the flags the source mount locks
    flags = MS_REMOUNT | MS_BIND | kept | MS_NOSUID | (0 if writable else MS_RDONLY)
    mount(None, target, None, flags, None, "making %s read-only" % path)

new = cfg["new_root"]
mount(None, "/", None, MS_REC | MS_PRIVATE, None, "making the mounts private")
mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755", "mounting the new root")
for path in cfg["read_only"]:
    if os.path.islink(path):
        os.makedirs(os.path.dirname(new + path), exist_ok=True)
        os.symlink(os.readlink(path), new + path)
    elif os.path.exists(path):
        bind(path, new)
for path in cfg["devices"]:
    if os.path.exists(path):
        bind(path, new, writable=True)
os.makedirs(new + "/sandbox")
mount("tmpfs", new + "/sandbox", "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=0700,uid=%d,gid=%d" % (cfg["folder_mb"], uid, gid),
      "mounting the program's folder")
with open(os.path.join(cfg["folder"], "program.py"), "rb") as f:
    source = f.read()
os.chdir(new)
check(libc.syscall(cfg["pivot_root"], b".", b"."), "pivot_root")
check(libc.umount2(b".", MNT_DETACH), "detaching the old root")
os.chdir("/")
mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None, "making the new root read-only")
libc.sethostname(b"sandbox", 7)

program = os.fork()
if program == 0:
    # G: process 1 of the new PID namespace, the unprivileged user, then the driver
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    if cfg["root"]:
        os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no new privileges)")
    if libc.syscall(cfg["keyctl"], 1, None) < 0 and ctypes.get_errno() != 38:  # a new, empty session keyring (38: no keyrings)
        fail("a keyring of its own: " + os.strerror(ctypes.get_errno()))
    os.chdir("/sandbox")
    with open("program.py", "wb") as f:
        f.write(source)
    run_driver()
_, code = os.waitpid(program, 0)
exit_like(code)
"""

# Runs the program (./program.py) as __main__ and, once its last statement has returned, writes
# the nonce to the harness's pipe and ends at once (no atexit hook or thread can change that).
_DRIVER = r"""
import os, sys
nonce, verdict = sys.argv[1].encode(), int(sys.argv[2])
del sys.argv[1:]
sys.argv[0] = "program.py"
with open("program.py", encoding="utf-8") as f:
    code = compile(f.read(), "program.py", "exec")
try:
    exec(code, {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__})
except SystemExit as e:
    sys.stderr.write("SystemExit: the program exited (%r) before its last statement returned\n" % (e.code,))
    sys.stderr.flush()
    os._exit(1)
sys.stdout.flush()
os.write(verdict, nonce)
os._exit(0)
"""

_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")


class SandboxUnavailable(ConfigError):
    """The boundary cannot be built on this system (another OS, namespaces refused)."""


@dataclass(frozen=True)
class Limits:
    """What a program may use."""

    seconds: float = 10.0  # wall clock
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # the largest file it may write
    folder_mb: int = 64  # what its folder may hold in all (contained: a file system in memory)
    open_files: int = 64
    processes: int = 16  # processes of its user (in its own user namespace when contained)


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


@lru_cache(maxsize=None)
def unavailable(sandbox: str = CONTAINED) -> str | None:
    """Why `sandbox` cannot run programs here (one line), or None. Checked once per process by
    running a program that must pass."""
    if sandbox == UNCONTAINED:
        return None
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces, and this system is {platform.system()}"
    if platform.machine() not in _SYSCALLS:
        return f"the sandbox does not know this processor architecture ({platform.machine()})"
    try:
        outcome = _run_checked("pass\n", Limits(seconds=10.0), sandbox)
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


def run_program(source: str, limits: Limits = Limits(), sandbox: str = CONTAINED) -> Outcome:
    """Run `source` as a Python program in a temporary folder of its own, inside `sandbox` (see
    the module's docstring); the folder is deleted afterwards. Refuses with SandboxUnavailable
    where the boundary cannot be built."""
    require(sandbox)
    try:
        return _run_checked(source, limits, sandbox)
    except _SetupFailed as e:  # it worked for the first program: say so, do not score it
        raise SandboxUnavailable(f"the sandbox could not be built for a program: {e}", param="sandbox") from None


class _SetupFailed(Exception):
    pass


def _run_checked(source: str, limits: Limits, sandbox: str) -> Outcome:
    scratch = tempfile.mkdtemp(prefix="localcos-eval-")
    try:
        folder = os.path.join(scratch, "program")
        new_root = os.path.join(scratch, "root")
        os.mkdir(folder, 0o700)
        os.mkdir(new_root, 0o700)
        with open(os.path.join(folder, "program.py"), "w", encoding="utf-8") as f:
            f.write(source)
        return _run(folder, new_root, limits, sandbox, os.geteuid() == 0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(folder: str, new_root: str, limits: Limits, sandbox: str, root: bool) -> Outcome:
    python, prefixes = python_paths()
    contained = sandbox == CONTAINED
    inside = "/sandbox" if contained else folder
    nonce = secrets.token_hex(16)
    config = {
        "contain": contained, "root": root, "folder": folder, "new_root": new_root, "python": python,
        "uid": _NOBODY if root else os.geteuid(), "gid": _NOBODY if root else os.getegid(),
        "read_only": [*_SYSTEM, *prefixes], "devices": list(_DEVICES),
        "pivot_root": _SYSCALLS.get(platform.machine(), (0, 0))[0], "keyctl": _SYSCALLS.get(platform.machine(), (0, 0))[1],
        "memory_mb": limits.memory_mb, "folder_mb": limits.folder_mb, "cpu_seconds": int(limits.seconds) + 1, "file_mb": limits.file_mb,
        "open_files": limits.open_files, "processes": limits.processes, "driver": _DRIVER, "nonce": nonce,
        "env": {"PATH": "/usr/bin:/bin", "HOME": inside, "TMPDIR": inside, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"},
    }  # fmt: skip
    verdict_read, verdict_write = os.pipe()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(config), str(verdict_write)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(verdict_write,),
            start_new_session=True, cwd="/",
        )  # fmt: skip
    finally:
        os.close(verdict_write)
    try:
        stderr, said, timed_out = _collect(proc, verdict_read, t0 + limits.seconds)
    finally:
        os.close(verdict_read)
        _kill(proc)
    seconds = time.monotonic() - t0
    code = proc.returncode
    if code == _SETUP_FAILED and said.startswith(b"setup: "):
        raise _SetupFailed(said[7:].decode("utf-8", "replace").strip())
    if said == nonce.encode():
        return Outcome(True, "passed", seconds)
    if timed_out:
        return Outcome(False, f"timed out after {limits.seconds:g}s", seconds)
    return Outcome(False, _why(code, stderr.decode("utf-8", errors="replace"), limits), seconds)


def _collect(proc: subprocess.Popen, verdict: int, deadline: float) -> tuple[bytes, bytes, bool]:
    """(the end of its stderr, what came on the verdict pipe, whether it timed out): both pipes
    read as data arrives, bounded, until the launcher ends or the deadline passes."""
    assert proc.stderr is not None
    err = proc.stderr.fileno()
    kept, said = bytearray(), bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(err, selectors.EVENT_READ)
        sel.register(verdict, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(kept), bytes(said), proc.poll() is None
            for key, _ in sel.select(min(left, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                elif key.fd == err:
                    kept += chunk
                    del kept[:-_KEPT_OUTPUT]
                elif len(said) < 256:
                    said += chunk[: 256 - len(said)]
            if proc.poll() is not None and not sel.select(0):
                break  # ended; whatever it left holding the pipes (uncontained) is killed next
    return bytes(kept), bytes(said), False


def _kill(proc: subprocess.Popen) -> None:
    """The launcher's process group, and with it (contained) the program's PID namespace."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _why(code: int, stderr: str, limits: Limits) -> str:
    """One line for a program whose last statement did not return."""
    if code < 0 or code > 128:
        sig = -code if code < 0 else code - 128
        if sig == signal.SIGXCPU:
            return f"used more than {int(limits.seconds) + 1}s of CPU"
        if sig == signal.SIGXFSZ:
            return f"wrote more than {limits.file_mb} MiB to a file"
        return f"killed by {signal.Signals(sig).name}" if sig in signal.valid_signals() else f"killed by signal {sig}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return f"exited with status {code} before its last statement returned"
    last = lines[-1]
    if last.startswith("MemoryError"):
        return f"out of memory (more than {limits.memory_mb} MiB)"
    last = "".join(c if c.isprintable() else "?" for c in last)
    return "failed: " + (last[:200] + "..." if len(last) > 200 else last)
