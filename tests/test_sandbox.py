"""The sandbox `localcos eval --run-code` runs model-written programs in: hostile programs are
contained by the kernel (nothing outside their folder changes or is read, no connection, no
signal, no process outlives them), and a program passes only when its last statement returned.

CI runs as root: the boundary must hold for root too (the program runs as nobody there)."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localcos.eval.codetasks import CodeTask
from localcos.eval.sandbox import CONTAINED, UNCONTAINED, Limits, SandboxUnavailable, require, run_program, unavailable

LIMITS = Limits(seconds=2.0, memory_mb=512)


class World:
    """What lies outside a program's folder: files (one of them secret), a listener on
    127.0.0.1, a process of the user who runs eval; and a marker a program passes to the
    processes it starts, to find any that outlived it."""

    def __init__(self, root: Path) -> None:
        self.outside = root / "outside"
        self.outside.mkdir()
        (self.outside / "keep").write_text("x")
        (self.outside / "secret").write_text("SECRET-7d1f")
        os.chmod(self.outside, 0o777)  # even a folder everybody may write to
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        self.marker = f"localcos-sandbox-test-{os.getpid()}"

    def state(self) -> dict[str, tuple]:
        """Every path under the outside folder with its type, mode, owner, size, times and bytes."""
        out = {}
        for path in sorted([self.outside, *self.outside.rglob("*")]):
            st = path.lstat()
            data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[str(path)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, data)
        return out

    def devices(self) -> dict[str, tuple]:
        """The host's device nodes a program sees (bound read-only into its root): their owner, mode and times."""
        out = {}
        for path in ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"):
            st = os.stat(path)
            out[path] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns)
        return out

    def connections(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1

    def survivors(self) -> list[str]:
        """Processes whose command line carries the marker."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if self.marker in cmdline and int(pid) != os.getpid():
                found.append(f"{pid}: {cmdline}")
        return found

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        self.listener.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("world"))
    yield w
    w.close()


# Hostile programs: each tries to reach outside its folder one way ({outside}, {pid}, {port} and
# {marker} filled in). Among them, the ways out of the audit-hook sandbox localcos had before.
HOSTILE = {
    "writes outside": "open('{outside}/new', 'w').write('x')",
    "opens for writing outside": "import os\nos.open('{outside}/new', os.O_WRONLY | os.O_CREAT)",
    "overwrites a file": "open('{outside}/keep', 'w').write('y')",
    "appends to a file": "open('{outside}/keep', 'a').write('y')",
    "deletes a tree": "import shutil\nshutil.rmtree('{outside}')",
    "deletes a file": "import os\nos.remove('{outside}/keep')",
    "renames a file": "import os\nos.rename('{outside}/keep', 'mine')",
    "chdir then a relative write": "import os\nos.chdir('{outside}')\nopen('new', 'w').write('x')",
    "writes through a folder's descriptor": (
        "import os\nfd = os.open('{outside}', os.O_RDONLY)\nos.open('new', os.O_WRONLY | os.O_CREAT, dir_fd=fd)\n"
        "os.unlink('keep', dir_fd=fd)\nos.rename('keep', 'gone', src_dir_fd=fd, dst_dir_fd=fd)"
    ),
    "changes metadata through a read-only descriptor": (
        "import os\nfd = os.open('{outside}/keep', os.O_RDONLY)\nos.fchmod(fd, 0o777)\nos.fchown(fd, 0, 0)\nos.utime(fd, (0, 0))"
    ),
    "opens a database outside": "import sqlite3\nsqlite3.connect('{outside}/db.sqlite').execute('create table t (x)')",
    "makes a FIFO and a device node outside": (
        "import os, stat\nos.mkfifo('{outside}/fifo')\nos.mknod('{outside}/node', stat.S_IFCHR | 0o666, os.makedev(1, 3))"
    ),
    "links and symlinks out": "import os\nos.symlink('{outside}/keep', 'l')\nopen('l', 'w').write('y')\nos.link('{outside}/keep', 'h')",
    "switches the old hook off first": (
        "import sys\nsys.modules['__main__'].__dict__.clear()\nsys._getframe().f_globals.clear()\n"
        "import builtins, posixpath\nbuiltins.any = lambda *a: False\nposixpath.abspath = lambda p: '/'\n"
        "open('{outside}/new', 'w').write('x')"
    ),
    "runs a command": "import subprocess\nsubprocess.run(['rm', '-r', '{outside}'], check=True)",
    "calls system": "import os\nassert os.system('rm -r {outside}') == 0",
    "spawns through multiprocessing": (
        "import multiprocessing as mp, shutil\nif __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=shutil.rmtree, args=('{outside}',))\n    p.start()\n    p.join()\n"
        "    assert p.exitcode == 0"
    ),
    "leaves a process behind with setsid": (
        "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n"
        "    os.execv(sys.executable, [sys.executable, '-c', 'import time, os; time.sleep(1.5); open(\"{outside}/late\", \"w\")', '{marker}'])\n"
        "time.sleep(0.2)"
    ),
    "forks forever": "import os\nwhile True:\n    os.fork()",
    # process 1 of its PID namespace leaves the launcher's process group, and the switch of user
    # cleared its parent-death signal: it must still be gone when run_program returns
    "process 1 leaves its group and sleeps": (
        "import os, sys\nos.setsid()\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', '{marker}'])"
    ),
    "signals a process outside": "import os, signal\nos.kill({pid}, signal.SIGKILL)",
    "signals through a pidfd": "import os, signal\nfd = os.pidfd_open({pid})\nsignal.pidfd_send_signal(fd, signal.SIGKILL)",
    "signals every process": "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "connects to 127.0.0.1": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'x')",
    # sockets of any family but AF_UNIX are refused: the network namespace isolates IP only, and
    # AF_VSOCK is the way to a virtual machine's host (only creating one is tried: never connect)
    "creates a vsock socket": "import socket\nsocket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)",
    "creates a netlink socket": "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)",
    "creates a packet socket": "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)",
    "creates an IP socket": "import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)",
    "makes a socket pair of another family": "import socket\nsocket.socketpair(socket.AF_INET)",
    # memory held outside the address space's limit, and after the program's end
    "holds System V shared memory": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmget.restype = ctypes.c_int\n"
        "for _ in range(3):\n    i = libc.shmget(0, 512 << 20, 0o1600)\n    if i < 0:\n        raise OSError(ctypes.get_errno(), 'shmget')\n"
        "    libc.shmat.restype = ctypes.c_void_p\n    at = libc.shmat(i, None, 0)\n    ctypes.memset(at, 1, 512 << 20)\n    libc.shmdt(ctypes.c_void_p(at))"
    ),
    "holds System V messages and semaphores": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for name in ('msgget', 'semget'):\n    if getattr(libc, name)(0, 1, 0o1600) < 0:\n        raise OSError(ctypes.get_errno(), name)"
    ),
    "holds a POSIX message queue": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nrt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
        "if rt.mq_open(b'/q', 0o102, 0o600, None) < 0:\n    raise OSError(ctypes.get_errno(), 'mq_open')"
    ),
    "holds a memfd": "import os\nfd = os.memfd_create('x')\nos.ftruncate(fd, 16 << 20)",
    "fills its folder with empty files": "for i in range(300000):\n    open('f%d' % i, 'w').close()",
    "mounts a file system in a user namespace of its own": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.unshare(0x10000000 | 0x20000) != 0:\n    raise OSError(ctypes.get_errno(), 'unshare')\n"
        "assert libc.mount(b'none', b'/sandbox', b'tmpfs', 0, b'size=8g') == 0"
    ),
    "forks into a namespace of its own": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.syscall(56 if os.uname().machine == 'x86_64' else 220, 0x10000000 | 17, 0, 0, 0, 0) < 0:\n"
        "    raise OSError(ctypes.get_errno(), 'clone')"
    ),
    "changes the times of /dev/null": "import os\nopen('/dev/null', 'w').write('x')\nos.utime('/dev/null', (0, 0))",
    # the kernel's upcalls, and kernel objects the host's root would pay for (round 4)
    "asks the kernel for an absent key": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.syscall(249 if os.uname().machine == 'x86_64' else 218, b'user', b'localcos-absent', b'x', 0) < 0:\n"
        "    raise OSError(ctypes.get_errno(), 'request_key')"
    ),
    "watches files with inotify": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.inotify_init1(0) < 0:\n    raise OSError(ctypes.get_errno(), 'inotify_init1')"
    ),
    "takes a fanotify group": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.fanotify_init(0, 0) < 0:\n    raise OSError(ctypes.get_errno(), 'fanotify_init')"
    ),
    "locks a file the host reads": "import fcntl, os\nfcntl.flock(open(os.__file__), fcntl.LOCK_SH | fcntl.LOCK_NB)",
    "takes a read lock on a file the host reads": "import fcntl, os\nfcntl.lockf(open(os.__file__), fcntl.LOCK_SH | fcntl.LOCK_NB)",
    "queues real-time signals": (
        "import os, signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\n"
        "for _ in range(1000):\n    os.kill(os.getpid(), signal.SIGRTMIN)\n"
        "n = 0\nwhile signal.sigtimedwait([signal.SIGRTMIN], 0) is not None:\n    n += 1\nraise RuntimeError('queued %d' % n)"
    ),
    "calls what a container's default profile refuses": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nx86 = os.uname().machine == 'x86_64'\n"
        "calls = dict(perf_event_open=(298, 241), userfaultfd=(323, 282), personality=(135, 92), sync=(162, 81),\n"
        "             syncfs=(306, 267), name_to_handle_at=(303, 264), open_by_handle_at=(304, 265), add_key=(248, 217),\n"
        "             keyctl=(250, 219))\n"
        "allowed = [n for n, (a, b) in calls.items() if libc.syscall(a if x86 else b, 0, 0, 0, 0, 0) >= 0 or ctypes.get_errno() != 1]\n"
        "if x86 and (libc.syscall(154, 0, 0, 0) >= 0 or ctypes.get_errno() != 1):\n    allowed.append('modify_ldt')\n"
        "assert not allowed, allowed\nraise PermissionError('every one refused')"
    ),
    "probes the page cache of the host's files": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nx86 = os.uname().machine == 'x86_64'\nfd = os.open(os.__file__, os.O_RDONLY)\n"
        "calls = dict(fadvise64=(221, 223), preadv2=(327, 286), pwritev2=(328, 287), mincore=(27, 232), readahead=(187, 213), cachestat=(451, 451))\n"
        "allowed = [n for n, (a, b) in calls.items() if libc.syscall(a if x86 else b, fd, 0, 0, 0, 0) >= 0 or ctypes.get_errno() != 1]\n"
        "assert not allowed, allowed\nraise PermissionError('every one refused')"
    ),
    # out-of-band data on a socket: the kernel's AF_UNIX code behind it had use-after-free bugs (round 5)
    "sends and reads a socket's out-of-band data": (
        "import socket\na, b = socket.socketpair()\nflags = socket.MSG_OOB | socket.MSG_DONTWAIT\n"
        "calls = dict(send=lambda: a.send(b'x', flags), recv=lambda: b.recv(1, flags), sendmsg=lambda: a.sendmsg([b'x'], [], flags),\n"
        "             recvmsg=lambda: b.recvmsg(1, 0, flags))\nallowed = []\nfor name, call in calls.items():\n    try:\n        call()\n"
        "        allowed.append(name)\n    except PermissionError:\n        pass\n    except OSError as e:\n        allowed.append(f'{{name}} ({{e}})')\n"
        "assert not allowed, allowed\nraise PermissionError('every one refused')"
    ),
    "calls what the allow list leaves out": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nx86 = os.uname().machine == 'x86_64'\n"
        "calls = dict(mount=(165, 40), bpf=(321, 280), kexec_load=(246, 104), acct=(163, 89), swapon=(167, 224), chroot=(161, 51),\n"
        "             syslog=(103, 116), io_uring_enter=(426, 426), init_module=(175, 105), shmat=(30, 196))\n"
        "said = {{n: ctypes.get_errno() if libc.syscall(a if x86 else b, 0, 0, 0, 0, 0) < 0 else 0 for n, (a, b) in calls.items()}}\n"
        "assert set(said.values()) == {{38}}, said\nraise OSError(38, 'none of them exists here')"
    ),
    "raises its core file limit": (
        "import resource\nlimit = resource.getrlimit(resource.RLIMIT_CORE)\ntry:\n"
        "    resource.setrlimit(resource.RLIMIT_CORE, (1 << 20, 1 << 20))\nexcept ValueError:\n"
        "    raise ValueError('core limit %r, not raised' % (limit,))"
    ),
    # the launcher's channel: the program cannot reach it, whatever descriptor it writes to
    "forges a setup failure": (
        "import os\nfor fd in range(3, 256):\n    try:\n        os.write(fd, b'setup: anything\\n')\n    except OSError:\n        pass\nos._exit(125)"
    ),
    "runs native code": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.unlink(b'{outside}/keep')\nlibc.kill({pid}, 9)\n"
        "libc.mkdir(b'{outside}/dir', 0o777)\nassert libc.unlink(b'{outside}/keep') == 0, ctypes.get_errno()"
    ),
    "loads an extension module by hand": (
        "import importlib.machinery, importlib.util, _ctypes\n"
        "loader = importlib.machinery.ExtensionFileLoader('_ctypes', _ctypes.__file__)\n"
        "module = importlib.util.module_from_spec(importlib.util.spec_from_loader('_ctypes', loader))\n"
        "loader.exec_module(module)\nimport ctypes\nassert ctypes.CDLL(None).rmdir(b'{outside}') == 0"
    ),
    "reads a secret": "import sys\nsys.stderr.write(open('{outside}/secret').read())\nraise SystemExit(1)",
    "reads /etc/shadow": "print(open('/etc/shadow').read())\nraise ValueError(open('/etc/shadow').read()[:200])",
    "replaces the harness's output files": "import os\nos.mkfifo('.stderr')\nos.mkdir('.stdout')\nraise ValueError('still here')",
    "hangs": "while True:\n    pass",
    "sleeps": "import time\ntime.sleep(60)",
    "allocates gigabytes": "x = bytearray(8 << 30)",
    "fills a file": "open('big', 'wb').write(b'0' * (64 << 20))",
    "prints invalid UTF-8": "import os, sys\nsys.stderr.buffer.write(b'\\xff\\xfe bad\\n')\nsys.stderr.flush()\nos._exit(3)",
}


def hostile(name: str, world: World) -> str:
    return HOSTILE[name].format(outside=world.outside, pid=world.process.pid, port=world.port, marker=world.marker)


def assert_contained(world: World, before: dict, outcome, name: str, devices: dict | None = None) -> None:
    assert world.state() == before, f"{name}: something outside changed"
    assert devices is None or world.devices() == devices, f"{name}: a device node's metadata changed"
    assert world.connections() == 0, f"{name}: a connection came in"
    assert world.process.poll() is None, f"{name}: the process outside was killed"
    assert not world.survivors(), f"{name}: processes outlived the program: {world.survivors()}"
    assert "\n" not in outcome.result and "SECRET" not in outcome.result and "root:" not in outcome.result, (name, outcome.result)


# what these programs do inside their own folder and PID namespace succeeds: they may pass
HARMLESS_INSIDE = {"leaves a process behind with setsid"}
# what some are told, in one line: the way out does not exist, is refused, or a limit ended it
SAYS = {
    "writes outside": "FileNotFoundError",
    "connects to 127.0.0.1": "Operation not permitted",
    "creates a vsock socket": "PermissionError: [Errno 1] Operation not permitted",
    "creates a netlink socket": "PermissionError: [Errno 1] Operation not permitted",
    "creates a packet socket": "PermissionError: [Errno 1] Operation not permitted",
    "creates an IP socket": "PermissionError: [Errno 1] Operation not permitted",
    "makes a socket pair of another family": "PermissionError: [Errno 1] Operation not permitted",
    "holds System V shared memory": "PermissionError: [Errno 1] shmget",
    "holds System V messages and semaphores": "PermissionError: [Errno 1] msgget",
    "holds a POSIX message queue": "PermissionError: [Errno 1] mq_open",
    "holds a memfd": "PermissionError: [Errno 1] Operation not permitted",
    "fills its folder with empty files": "No space left on device",
    "mounts a file system in a user namespace of its own": "PermissionError: [Errno 1] unshare",
    "forks into a namespace of its own": "PermissionError: [Errno 1] clone",
    "changes the times of /dev/null": "Read-only file system",
    "asks the kernel for an absent key": "PermissionError: [Errno 1] request_key",
    "watches files with inotify": "PermissionError: [Errno 1] inotify_init1",
    "takes a fanotify group": "PermissionError: [Errno 1] fanotify_init",
    "locks a file the host reads": "PermissionError: [Errno 1] Operation not permitted",
    "takes a read lock on a file the host reads": "PermissionError: [Errno 1] Operation not permitted",
    # its own queue stops at its own small limit: the host's root, whom the kernel charges, keeps the rest
    "queues real-time signals": "RuntimeError: queued 64",
    "calls what a container's default profile refuses": "PermissionError: every one refused",
    "probes the page cache of the host's files": "PermissionError: every one refused",
    "sends and reads a socket's out-of-band data": "PermissionError: every one refused",
    # not on the allow list: as if the kernel had no such call
    "calls what the allow list leaves out": "OSError: [Errno 38] none of them exists here",
    # a core file limit of 1 (a hard one): no core_pattern helper is started for a crash
    "raises its core file limit": "ValueError: core limit (1, 1), not raised",
    "forges a setup failure": "exited with status 125 before its last statement returned",
    "signals a process outside": "ProcessLookupError",
    "reads /etc/shadow": "FileNotFoundError: [Errno 2] No such file or directory: '/etc/shadow'",
    "hangs": "timed out after 2s",
    "sleeps": "timed out after 2s",
    "process 1 leaves its group and sleeps": "timed out after 2s",
    "allocates gigabytes": "out of memory (more than 512 MiB)",
    "fills a file": "File too large",
    "prints invalid UTF-8": "failed: \ufffd\ufffd bad",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_program_is_contained(world, name):
    before, devices = world.state(), world.devices()
    outcome = run_program(hostile(name, world), LIMITS)
    assert outcome.passed == (name in HARMLESS_INSIDE), (name, outcome.result)
    assert SAYS.get(name, "") in outcome.result, (name, outcome.result)
    assert_contained(world, before, outcome, name, devices)


def test_nothing_changes_after_a_grace_period_for_late_writers(world):
    before = world.state()
    outcome = run_program(hostile("leaves a process behind with setsid", world), LIMITS)
    time.sleep(2.0)  # the process it left would have written at 1.5 s
    assert_contained(world, before, outcome, "late writer")


def test_the_filter_allows_by_name_and_refuses_nothing_it_allows():
    from localcos.eval import launcher

    assert not set(launcher._ALLOWED) & set(launcher._DENIED)
    assert all(name in launcher._NUMBERS for name in (*launcher._ALLOWED, *launcher._DENIED))
    for machine, (_, numbers) in launcher.ARCHITECTURES.items():
        assert len(set(numbers.values())) == len(numbers), machine  # no two names share a number
        program = launcher.seccomp_filter(machine)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096, machine


def test_a_program_may_use_its_own_folder_and_print_anything():
    ok = run_program("open('notes.txt', 'w').write('x')\nimport os, sys, tempfile\nos.remove('notes.txt')\n"
                     "open(os.path.join(tempfile.gettempdir(), 't'), 'w').write('x')\nsys.stdout.buffer.write(b'\\xff' * 100000)\n")  # fmt: skip
    assert ok.passed and ok.result == "passed", ok.result
    failed = run_program("def f():\n    return 3\nassert f() == 4, 'f is wrong'")
    assert not failed.passed and failed.result == "failed: AssertionError: f is wrong"
    # processes it starts run inside, and die with it
    forks = run_program(
        "import subprocess, sys\nassert subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True).stdout == b'1\\n'"
    )
    assert forks.passed, forks.result


def test_the_programs_folder_is_gone_afterwards(tmp_path, monkeypatch):
    import tempfile

    run_program("pass")  # the boundary checked once, outside the folder watched
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run_program("open('left.txt', 'w').write('x')").passed
    assert list(tmp_path.iterdir()) == []


# --- verdicts: passed only when the test's check returned -----------------------------------------

TASK = CodeTask("t/0", "def double(x):\n", "def check(candidate):\n    assert candidate(2) == 5, 'wrong'\n", "double")
# completions (and code after the function) that end the program before or around a failing check
FALSE_PASSES = {
    "sys.exit(0)": "    import sys\n    sys.exit(0)\n",
    "os._exit(0)": "    import os\n    os._exit(0)\n",
    "exit()": "    exit()\n",
    "quit()": "    quit()\n",
    "raise SystemExit": "    raise SystemExit\n",
    "finally raises SystemExit(0)": "    try:\n        return x * 2\n    finally:\n        raise SystemExit(0)\n",
    "trailing sys.exit()": "    return x * 2\n\nimport sys\nsys.exit()\n",
    "trailing unittest.main()": "    return x * 2\n\nimport unittest\nif __name__ == '__main__':\n    unittest.main()\n",
    "atexit os._exit(0)": "    return x * 2\n\nimport atexit, os\natexit.register(os._exit, 0)\n",
    "excepthook os._exit(0)": "    return x * 2\n\nimport os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "a thread calls os._exit(0)": (
        "    return x * 2\n\nimport os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), os._exit(0))).start()\n"
        "def _slow(*a):\n    time.sleep(1)\nimport sys\nsys.excepthook = _slow\n"
    ),
}


@pytest.mark.parametrize("name", list(FALSE_PASSES))
def test_a_program_that_exits_before_its_check_returns_fails(name):
    outcome = run_program(TASK.program(FALSE_PASSES[name]), LIMITS)
    assert not outcome.passed and "\n" not in outcome.result, (name, outcome.result)


# completions of TASK's function, wrong, each with code after it that forged a pass when the
# program and its test shared a process: it found the verdict's channel (by argv, by scanning its
# descriptors, from the driver's frame), swapped `check`, or returned a value equal to anything
_PEEK_AND_SEND = (
    "def _forge(end):\n    import os, socket\n"
    "    s = end if isinstance(end, socket.socket) else socket.socket(fileno=end if isinstance(end, int) else end.fileno())\n"
    "    s.setblocking(False)\n    try:\n        secret = s.recv(64, socket.MSG_PEEK)\n    except OSError:\n        secret = b'0' * 32\n"
    "    try:\n        s.send(secret)\n    except OSError:\n        pass\n"
)
FORGERS = {
    "the verdict's channel by argv": "    return x * 2\n\n" + _PEEK_AND_SEND + "import os, sys\n_forge(int(sys.orig_argv[-1]))\nos._exit(0)\n",
    "the verdict's channel by a descriptor scan": "    return x * 2\n\n" + _PEEK_AND_SEND + (
        "import os, stat\nfor fd in range(3, 64):\n    try:\n        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n            _forge(fd)\n"
        "    except OSError:\n        pass\nos._exit(0)\n"),
    "the verdict's channel from the caller's frame, at exit": "    return x * 2\n\n" + _PEEK_AND_SEND + (
        "import atexit, os, sys\nframe = sys._getframe(1)\nend = frame.f_locals.get('channel')\n"
        "atexit.register(lambda: (_forge(end), os._exit(0)))\n"),
    "a trace function swaps check": "    return x * 2\n\n" + (
        "import sys\ndef _swap(frame, event, arg):\n    g = frame.f_globals\n"
        "    if event == 'line' and callable(g.get('check')) and g['check'].__name__ == 'check':\n"
        "        g['check'] = lambda candidate: None\n    return _swap\nsys.settrace(_swap)\nsys._getframe().f_trace = _swap\n"),
    "a value equal to anything": "    class Equal:\n        def __eq__(self, other):\n            return True\n    return Equal()\n",
    "an int equal to anything": "    class Equal(int):\n        def __eq__(self, other):\n            return True\n    return Equal(x)\n",
}


@pytest.mark.parametrize("name", list(FORGERS))
def test_no_value_frame_global_or_descriptor_of_the_programs_forges_a_pass(name):
    outcome = run_program(TASK.program(FORGERS[name]), LIMITS)
    assert not outcome.passed and "\n" not in outcome.result, (name, outcome.result)


def test_the_test_runs_on_plain_data_with_the_tasks_own_helpers_and_the_programs_exceptions():
    # the helper the test calls is the prompt's, whatever the program defines after it
    prompt = 'def poly(x):\n    return x + 1\n\n\ndef solve(y):\n    """y, solved."""\n'
    helper = CodeTask("t/2", prompt, "def check(candidate):\n    assert poly(candidate(3)) == 100\n", "solve")
    assert run_program(helper.program("    return 99\n"), LIMITS).passed
    redefined = run_program(helper.program("    return 3\n\n\ndef poly(x):\n    return 100\n"), LIMITS)
    assert redefined.result == "failed: AssertionError", redefined.result
    # arguments changed in place come back changed; the exception the test expects is the one raised;
    # values of every plain type cross as they are, a tuple's subclass as a tuple
    sorts = CodeTask("t/3", "def sort_in_place(items):\n",
                     "def check(candidate):\n    items = [3, 1, 2]\n    assert candidate(items) is None and items == [1, 2, 3]\n"
                     "    try:\n        candidate(None)\n    except ValueError as e:\n        assert str(e) == 'no items'\n    else:\n        assert False\n"
                     "    big = 3 ** 5000\n    assert candidate([big, -1.5, float('inf')]) is None\n"
                     "    value = candidate({'k': (1, b'x', {2, 3}, frozenset([4]), 2j, None, True, bytearray(b'y'))})\n"
                     "    assert value == ({'k': (1, b'x', {2, 3}, frozenset([4]), 2j, None, True, bytearray(b'y'))}, 3 ** 5000)\n"
                     "    assert type(value) is tuple and type(value[0]['k'][1]) is bytes\n", "sort_in_place")  # fmt: skip
    body = ("    if items is None:\n        raise ValueError('no items')\n    if isinstance(items, dict):\n"
            "        import collections\n        return collections.namedtuple('P', 'a b')(items, 3 ** 5000)\n    items.sort()\n")  # fmt: skip
    assert run_program(sorts.program(body), LIMITS).passed, run_program(sorts.program(body), LIMITS).result
    unsorted = run_program(sorts.program(body.replace("items.sort()", "sorted(items)")), LIMITS)
    assert unsorted.result == "failed: AssertionError", unsorted.result
    # what the program raises is said as the test met it; an argument of the test's that is not plain data is refused
    raising = run_program(GOOD.program("    return x // 0\n"), LIMITS)
    assert raising.result == "failed: ZeroDivisionError: integer division or modulo by zero", raising.result
    unsendable = CodeTask("t/4", "def f(g):\n", "def check(candidate):\n    assert candidate(lambda: 1) == 1\n", "f")
    refused = run_program(unsendable.program("    return g()\n"), LIMITS)
    assert refused.result == "failed: CannotCross: a function cannot cross between the test and the program (only plain data does)", refused.result
    # the program's process ended during a call: failed, even where the test catches every exception
    swallows = CodeTask("t/5", "def f(x):\n", "def check(candidate):\n    for x in (1, 2):\n        try:\n            candidate(x)\n"
                        "        except Exception:\n            pass\n", "f")  # fmt: skip
    assert run_program(swallows.program("    return x\n"), LIMITS).passed
    ended = run_program(swallows.program("    import os\n    os._exit(0)\n"), LIMITS)
    assert ended.result == "exited with status 0 before its last statement returned", ended.result


def test_plain_data_crosses_as_it_is_and_nothing_else_is_built():
    import collections
    import math

    from localcos.eval.crossing import CannotCross, Opaque, decode, encode

    def across(value, strict=True):
        return decode(json.loads(json.dumps(encode(value, strict))))

    for value in (None, True, 0, -(2**60), 3**5000, 1.5, -0.0, float("inf"), "é\udc80", b"\x00", bytearray(b"a"), 2 + 3j,
                  [1, (2, {3: [4]})], {frozenset([1]): {"a"}, (1, 2): None}):  # fmt: skip
        back = across(value)
        assert back == value and type(back) is type(value), value
    assert math.isnan(across(float("nan")))
    pair = across(collections.namedtuple("P", "a b")(1, 2))
    assert pair == (1, 2) and type(pair) is tuple and type(across(collections.Counter("aab"))) is dict
    # not plain data: refused where the test sends it, opaque where the program answers with it
    with pytest.raises(CannotCross):
        encode(object())
    seen = across([object()], strict=False)[0]
    assert isinstance(seen, Opaque) and seen.kind == "object" and seen != seen.kind and seen != 1
    with pytest.raises(CannotCross):
        encode(functools.reduce(lambda inner, _: [inner], range(200), []))
    # what is not a tree of `encode`'s builds nothing
    deep = functools.reduce(lambda inner, _: ["l", inner], range(200), ["l"])
    for node in ({"a": 1}, [], ["z"], ["i", 5], ["o", 1], ["d", [1]], ["d", [1, 2, 3]], ["s", ["l"]], ["c", "1", 2], [1, 2], deep):
        with pytest.raises((ValueError, TypeError)):
            decode(node)


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Equal values of the same types, recursively, floats by their bits (NaN payloads, -0.0)."""
    import struct

    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack(">d", a) == struct.pack(">d", b)
    if type(a) is complex:
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return len(a) == len(b) and all(k in b and _same(v, b[k]) for k, v in a.items()) and all(_same(k, k) for k in a)
    return bool(a == b)


def _plain_data():  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    text = st.text(st.characters(codec=None, categories=None), max_size=6)  # lone surrogates among them
    payload_nans = st.integers(0, (1 << 51) - 1).map(lambda bits: __import__("struct").unpack(">d", (0x7FF8 << 48 | bits).to_bytes(8, "big"))[0])
    scalars = (st.none() | st.booleans() | st.integers(-(2**200), 2**200) | st.floats(allow_subnormal=True) | payload_nans
               | st.sampled_from([-0.0, 5e-324, float("-inf")]) | text | st.binary(max_size=6) | st.binary(max_size=6).map(bytearray)
               | st.complex_numbers(allow_nan=True))  # fmt: skip
    keys = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | text | st.binary(max_size=4)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                        | st.dictionaries(keys, inner, max_size=4) | st.sets(keys, max_size=4) | st.frozensets(keys, max_size=4),
                        max_leaves=12)  # fmt: skip


def test_every_plain_value_crosses_exactly():
    """A round trip through the channel's JSON gives back the same value, of the same types:
    strings as their code points (two lone surrogates stay two, also as dict keys and set items),
    floats by their bits (-0.0, NaN payloads, subnormals), big ints, bytes, nested containers."""
    from hypothesis import given, settings

    from localcos.eval.crossing import decode, encode

    def across(value):  # type: ignore[no-untyped-def]
        return decode(json.loads(json.dumps(encode(value), separators=(",", ":")).encode("ascii")))

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(_plain_data())
    def round_trip(value):  # type: ignore[no-untyped-def]
        assert _same(across(value), value), value

    round_trip()
    for value in ("\ud83d\ude00", {"\ud83d\ude00": 1}, {"\ud83d\ude00"}, frozenset(["\udc80x"])):
        back = across(value)
        assert _same(back, value) and back != {"\U0001F600": 1} and "\U0001F600" not in (back if not isinstance(back, str) else [back])
    for node in (["u", "zz"], ["u", "00"], ["n", "7ff8"], ["c", ["n", "00"], 1]):
        with pytest.raises(ValueError):
            decode(node)


def test_two_lone_surrogates_cross_as_two_characters_to_the_program_and_back():
    """The program's two lone surrogates are not the test's one character (no forged pass), and a
    correct program given two lone surrogates (also as a dict key or a set item) passes."""
    forged = CodeTask("t/s", "def f(x):\n", "def check(candidate):\n    assert candidate(2) == '\\U0001F600'\n", "f")
    assert not run_program(forged.program("    return '\\ud83d\\ude00'\n"), LIMITS).passed
    lengths = CodeTask("t/l", "def f(x):\n", "def check(candidate):\n    assert candidate('\\ud83d\\ude00') == 2\n"
                       "    assert candidate({'\\ud83d\\ude00': 1}) == 2\n    assert candidate({'\\ud83d\\ude00'}) == 2\n", "f")  # fmt: skip
    assert run_program(lengths.program("    return len(x if isinstance(x, str) else next(iter(x)))\n"), LIMITS).passed


def test_a_correct_completion_passes_and_a_wrong_one_says_why():
    good = CodeTask("t/1", "def double(x):\n", "def check(candidate):\n    assert candidate(2) == 4\n", "double")
    assert run_program(good.program("    return x * 2\n"), LIMITS).passed
    wrong = run_program(TASK.program("    return x * 2\n"), LIMITS)
    assert not wrong.passed and wrong.result == "failed: AssertionError: wrong"
    early = run_program(TASK.program("    import sys\n    sys.exit(0)\n"), LIMITS)
    assert early.result == "failed: SystemExit: the program exited (0) before its test returned"
    gone = run_program(TASK.program("    import os\n    os._exit(0)\n"), LIMITS)
    assert gone.result == "exited with status 0 before its last statement returned"


# --- the verdict is the program's own process, judged from outside it ------------------------------

GOOD = CodeTask("t/1", "def double(x):\n", "def check(candidate):\n    assert candidate(2) == 4, 'wrong'\n", "double")
# code after a correct function: a child forked there either ends itself or falls through to the check
CHILD_EXITS = "    return x * 2\n\nimport os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
CHILD_FALLS_THROUGH = "    return x * 2\n\nimport os\npid = os.fork()\nif pid:\n    os.waitpid(pid, 0)\n"


def test_a_forked_childs_end_is_never_the_programs():
    # the child did nothing and runs the rest of the program to its end; the parent, the program, fails
    parent_fails = run_program(
        "import os\npid = os.fork()\nif pid:\n    os.waitpid(pid, 0)\n    assert False, 'the parent fails'\n", LIMITS
    )
    assert not parent_fails.passed and parent_fails.result == "failed: AssertionError: the parent fails"
    # a correct program whose child ends itself, or falls through to the check too: passed, once
    for completion in (CHILD_EXITS, CHILD_FALLS_THROUGH):
        outcome = run_program(GOOD.program(completion), LIMITS)
        assert outcome.passed, (completion, outcome.result)
    # a wrong program whose child falls through: the child's check fails too, the program fails
    assert run_program(TASK.program(CHILD_FALLS_THROUGH), LIMITS).result == "failed: AssertionError: wrong"


def test_the_verdicts_secret_is_nowhere_the_program_can_reach_by_name():
    # the driver's secret was a global of its __main__: one attribute away
    by_name = run_program("import __main__, os\nos.write(__main__.verdict, __main__.nonce)\nassert False, 'fails'\n", LIMITS)
    assert not by_name.passed and "AttributeError" in by_name.result, by_name.result
    # nor anywhere in its memory while it runs: every hexadecimal string of the nonce's length that
    # any object, module, frame, argument or environment variable holds, written to every descriptor
    search = (
        "import gc, os, re, sys\nfound = set()\nhexa = re.compile(r'[0-9a-f]{32}')\n"
        "def look(v):\n    if isinstance(v, (str, bytes)):\n        found.update(hexa.findall(v if isinstance(v, str) else v.decode('latin-1')))\n"
        "for o in gc.get_objects():\n    look(o)\n    if isinstance(o, dict):\n        for v in list(o.values()):\n            look(v)\n"
        "for m in list(sys.modules.values()):\n    for v in list(vars(m).values()):\n        look(v)\n"
        "f = sys._getframe()\nwhile f:\n    for v in list(f.f_locals.values()):\n        look(v)\n    f = f.f_back\n"
        "for v in [*sys.argv, *sys.orig_argv, *os.environ.values()]:\n    look(v)\n"
        "for secret in found:\n    for fd in range(3, 64):\n        try:\n            os.write(fd, secret.encode())\n"
        "        except OSError:\n            pass\n"
        "assert False, 'fails'\n"
    )
    outcome = run_program(search, LIMITS)
    assert not outcome.passed and outcome.result == "failed: AssertionError: fails", outcome.result


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGSEGV"])
def test_a_program_that_signals_itself_dies_as_it_would_outside_and_the_verdict_names_the_signal(sig):
    outcome = run_program(f"import os, signal, time\nos.kill(os.getpid(), signal.{sig})\ntime.sleep(5)\n", LIMITS)
    assert not outcome.passed and outcome.result == f"killed by {sig}", outcome.result
    assert outcome.seconds < 2


def test_socket_buffers_and_pipes_stay_at_the_systems_defaults():
    # each socket pair and pipe it can open, grown as far as it may and filled without blocking
    hog = (
        "import errno, fcntl, os, socket\nheld = refused = 0\nkept = []\n"
        "for _ in range(15):\n    a, b = socket.socketpair()\n    kept += [a, b]\n"
        "    for s in (a, b):\n        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF, 32, 33):  # 32, 33: the *BUFFORCE options\n"
        "            try:\n                s.setsockopt(socket.SOL_SOCKET, opt, 1 << 30)\n"
        "            except PermissionError:\n                refused += 1\n"
        "        s.setblocking(False)\n        while True:\n            try:\n                held += s.send(b'x' * 65536)\n"
        "            except BlockingIOError:\n                break\n"
        "for _ in range(15):\n    r, w = os.pipe()\n    kept += [r, w]\n"
        "    try:\n        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ\n    except PermissionError:\n        refused += 1\n"
        "    os.set_blocking(w, False)\n    while True:\n        try:\n            held += os.write(w, b'x' * 65536)\n"
        "        except BlockingIOError:\n            break\n"
        "raise SystemExit(f'held {held >> 20} MiB, {refused} refused')\n"
    )
    outcome = run_program(hog, Limits(seconds=10.0, memory_mb=128))
    held, refused = map(int, re.search(r"held (\d+) MiB, (\d+) refused", outcome.result).groups())  # type: ignore[union-attr]
    assert refused == 15 * 2 * 4 + 15, outcome.result
    assert held < 256, outcome.result


def test_nothing_of_a_run_outlives_an_eval_that_is_killed_and_what_it_left_goes_at_the_next_start(tmp_path):
    # the program clears its own parent-death signal and sleeps; eval is killed as the OOM killer would
    name = f"lcos-orph-{os.getpid() % 100000}"
    program = f"import ctypes, time\nlibc = ctypes.CDLL(None)\nlibc.prctl(1, 0, 0, 0, 0)\nlibc.prctl(15, {name.encode()!r}, 0, 0, 0)\ntime.sleep(60)\n"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    harness = subprocess.Popen([sys.executable, "-c", f"from localcos.eval.sandbox import run_program, Limits\nrun_program({program!r}, Limits(seconds=60))"],
                               env=env)  # fmt: skip
    try:
        pid = find_process(name)
        uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
        assert uid == (65534 if os.geteuid() == 0 else os.geteuid())
        harness.kill()
        harness.wait(timeout=10)
    finally:
        harness.kill()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the program outlived eval"
    left = [p.name for p in tmp_path.iterdir()]
    assert left and all(n.startswith(f"localcos-eval-{harness.pid}-") for n in left), left
    from localcos.eval import memcg

    place = memcg.hierarchy()
    groups = [] if place is None else [n for n in os.listdir(place.folder) if n.startswith(f"localcos-eval-{harness.pid}-")]
    assert place is None or groups, "the run's cgroup should be there, left by the killed eval"
    # the next eval to run a program removes them; a live eval's are left alone
    again = subprocess.run([sys.executable, "-c", "from localcos.eval.sandbox import run_program\nassert run_program('pass').passed"],
                           env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert list(tmp_path.iterdir()) == []
    assert place is None or not [n for n in os.listdir(place.folder) if n in groups]


def test_the_programs_processes_together_are_bounded_where_a_memory_cgroup_can_be_had():
    from localcos.eval import memcg
    from localcos.eval.sandbox import memory_bound

    # eight processes of 100 MiB each, every one under its own address-space limit
    eight = ("import os, time\nkids = []\nfor _ in range(8):\n    pid = os.fork()\n    if pid == 0:\n        x = bytearray(100 << 20)\n"
             "        x[::4096] = b'1' * len(x[::4096])\n        time.sleep(0.5)\n        os._exit(0)\n    kids.append(pid)\n"
             "for pid in kids:\n    assert os.waitpid(pid, 0)[1] == 0\n")  # fmt: skip
    if memcg.hierarchy() is None:  # e.g. an ordinary user on a systemd machine: eval says so as it starts
        assert "no memory cgroup can be had here" in memory_bound(Limits())
        return
    assert "for all of them together" in memory_bound(Limits(memory_mb=512))
    outcome = run_program(eight, Limits(seconds=10.0, memory_mb=512))
    assert outcome.result == "out of memory (its processes held more than 512 MiB in all)", outcome.result
    assert run_program(eight, Limits(seconds=10.0, memory_mb=1536)).passed


# --- where the boundary cannot be built: a refusal, or an opt-in by name -------------------------------


def launcher_with(tmp_path: Path, old: str, new: str) -> str:
    """A copy of the launcher with `old` (which must occur) replaced by `new`: a system that
    fails where the real one would not."""
    from localcos.eval import sandbox

    source = Path(sandbox._LAUNCHER).read_text()
    assert old in source
    path = tmp_path / "launcher.py"
    path.write_text(source.replace(old, new))
    return str(path)


def test_where_namespaces_are_refused_run_code_refuses_in_one_line_and_none_is_an_explicit_opt_in(monkeypatch, tmp_path):
    # a system that refuses user namespaces, as a kernel or a container may: the launcher's unshare fails
    refused = launcher_with(tmp_path, "self.check(libc.unshare(", "self.check(-1 if ctypes.set_errno(1) is not None else libc.unshare(")
    monkeypatch.setattr("localcos.eval.sandbox._LAUNCHER", refused)
    unavailable.cache_clear()
    try:
        why = unavailable(CONTAINED)
        assert why is not None and "unshare" in why and "Operation not permitted" in why
        with pytest.raises(SandboxUnavailable, match="--sandbox none") as e:
            require(CONTAINED)
        assert "\n" not in str(e.value)
        # --sandbox none: the limits only, the verdict as before
        assert run_program("pass", LIMITS, UNCONTAINED).passed
        assert run_program("x = bytearray(8 << 30)", LIMITS, UNCONTAINED).result == "out of memory (more than 512 MiB)"
        assert not run_program(TASK.program("    import os\n    os._exit(0)\n"), LIMITS, UNCONTAINED).passed
    finally:
        unavailable.cache_clear()


# --- what a program leaves, and why it ended ----------------------------------------------------------


def test_held_shared_memory_is_refused_and_the_hosts_is_where_it_was(world):
    def shmem() -> int:
        return next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("Shmem:")) << 10

    before = shmem()
    outcome = run_program(hostile("holds System V shared memory", world), Limits(seconds=5.0, memory_mb=1024))
    assert not outcome.passed and "shmget" in outcome.result
    assert shmem() - before < 256 << 20  # it tried 1.5 GiB; what other tests hold meanwhile is far less


# --- round 5: nothing a program does reaches eval's init or the judge -----------------------------

_EVERY_SIGNAL = "[s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]"
# each a program and whether it passes; run as root, and as an ordinary user where one can run eval
ROUND5 = {
    # process 1 is eval's init: it handles no signal, so none reaches it (Python's SIGINT handler did)
    "signals process 1 with every catchable signal": (GOOD.program(
        "    return x * 2\n\nimport os, signal\n"
        f"for s in {_EVERY_SIGNAL}:\n    try:\n        os.kill(1, s)\n    except OSError:\n        pass\n"), True),
    # the judge keeps no capability, not even one it could take back
    "the judge's capabilities": (CodeTask("t/c", "def f(x):\n", (
        "def check(candidate):\n    import ctypes, struct\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    header, sets = ctypes.create_string_buffer(struct.pack('Ii', 0x20080522, 0), 8), ctypes.create_string_buffer(24)\n"
        "    assert libc.capget(header, sets) == 0 and sets.raw == bytes(24), sets.raw.hex()\n"
        "    assert [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1] == []\n    assert candidate(1) == 1\n"), "f",
    ).program("    return x\n"), True),
    # the judge's environment is the program's, the box's (the harness's own variables are not there)
    "the judge's environment": (CodeTask("t/e", "def f(x):\n", "def check(candidate):\n    import os\n"
                                         "    assert candidate(0) == dict(os.environ)\n", "f").program(
        "    import os\n    return dict(os.environ)\n"), True),
    # a warning makes linecache open the test's file name where the judge works: the program's FIFO there blocked it
    "a FIFO planted as test.py": (CodeTask("t/w", "def f(x):\n", "def check(candidate):\n    import warnings\n"
                                           "    warnings.warn('look')\n    assert candidate(2) == 4\n", "f").program(
        "    return x * 2\n\nimport os\nos.mkfifo('test.py')\n"), True),
    # the limits of every other process of the box (eval's init, the judge) out of reach; its own not
    "prlimit64 on the judge and the init": (GOOD.program(
        "    import os, resource\n    changed = []\n    for pid in range(1, 9):\n        if pid != os.getpid():\n"
        "            try:\n                resource.prlimit(pid, resource.RLIMIT_AS, (32 << 20, 32 << 20))\n"
        "                changed.append(pid)\n            except OSError:\n                pass\n"
        "    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))\n"
        "    return x * 2 if not changed else changed\n"), True),
}  # fmt: skip


@pytest.mark.parametrize("name", list(ROUND5))
def test_nothing_a_program_does_reaches_evals_init_or_the_judge(name, monkeypatch):
    monkeypatch.setenv("LOCALCOS_THE_HARNESS_ONLY", "1")
    program, passes = ROUND5[name]
    outcome = run_program(program, LIMITS)
    assert outcome.passed is passes, (name, outcome.result)


_AS_ORDINARY_USER = """
import json, sys
try:
    from localcos.eval.sandbox import Limits, Program, run_program, unavailable
except (ImportError, OSError) as e:  # localcos unreadable to this user
    print(json.dumps({"unavailable": f"localcos cannot be imported: {type(e).__name__}: {e}"}))
    sys.exit(0)
why = unavailable()
if why:
    print(json.dumps({"unavailable": why}))
    sys.exit(0)
outcomes = {name: run_program(Program(*fields), Limits(**json.loads(sys.argv[1]))) for name, fields in json.load(sys.stdin).items()}
print(json.dumps({name: [o.passed, o.result] for name, o in outcomes.items()}))
"""


def test_as_an_ordinary_user_nothing_a_program_does_reaches_evals_init_or_the_judge():
    """There the init, the program and the judge share one user id: a program could signal the
    init (a setup failure: the whole eval stopped) and change the judge's limits, and the judge
    kept the user namespace's every capability. As root: an unused user id, where it can run
    this interpreter; else the one line why not."""
    import dataclasses

    user: dict[str, object] = {}
    if os.geteuid() == 0:
        uid = next(u for u in range(60000, 65000) if not _has_account(u))
        user = {"user": uid, "group": uid, "extra_groups": []}
    programs = {name: [program.source, program.test, program.context, program.entry_point] for name, (program, _) in ROUND5.items()}
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LOCALCOS_THE_HARNESS_ONLY": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    try:
        done = subprocess.run([sys.executable, "-c", _AS_ORDINARY_USER, json.dumps(dataclasses.asdict(LIMITS))], input=json.dumps(programs),
                              capture_output=True, text=True, cwd="/", env=env, timeout=120, **user)  # type: ignore[call-overload]
    except PermissionError as e:
        pytest.skip(f"an ordinary user cannot run this interpreter ({sys.executable}: {e.strerror}): a folder above it is closed to others")
    assert done.returncode == 0, done.stderr  # a program's run raised (on main: the init's KeyboardInterrupt, a setup failure)
    outcomes = json.loads(done.stdout)
    if "unavailable" in outcomes:
        pytest.skip(f"an ordinary user cannot run eval's sandbox here: {outcomes['unavailable']}")
    assert {name: passed for name, (passed, _) in outcomes.items()} == {name: passes for name, (_, passes) in ROUND5.items()}, outcomes


def _has_account(uid: int) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def find_process(name: str, timeout: float = 20.0) -> int:
    """The process whose name (/proc/PID/comm) is `name`, waited for (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    return int(pid)
            except OSError:
                continue
        time.sleep(0.02)
    raise AssertionError(f"no process named {name}")


def test_a_program_killed_from_outside_says_by_which_signal():
    # as the OOM killer would: SIGKILL to process 1 from outside its namespace
    from concurrent.futures import ThreadPoolExecutor

    name = f"lcos-{os.getpid() % 100000}"
    program = f"import ctypes, time\nctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\ntime.sleep(30)"
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_program, program, Limits(seconds=30.0))
        os.kill(find_process(name), signal.SIGKILL)
        outcome = running.result(timeout=30)
    assert outcome.result == "killed by SIGKILL", outcome.result


def test_the_cpu_limit_is_named_as_the_reason():
    spin = "while True:\n    pass"
    outcome = run_program(spin, Limits(seconds=10.0, cpu_seconds=1))
    assert outcome.result == "killed by SIGXCPU: the CPU limit (more than 1s of CPU)", outcome.result
    assert outcome.seconds < 6
    # a program that ignores SIGXCPU: the kernel's SIGKILL a second later
    stubborn = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"
    assert run_program(stubborn, Limits(seconds=10.0, cpu_seconds=1)).result == "killed by SIGKILL: the CPU limit (more than 1s of CPU)"
    # a process it starts gets SIGXCPU at the limit too
    child = "import subprocess, sys\nr = subprocess.run([sys.executable, '-c', 'while True: pass'])\nraise SystemExit(f'child ended by {-r.returncode}')"
    assert f"child ended by {int(signal.SIGXCPU)}" in run_program(child, Limits(seconds=10.0, cpu_seconds=1)).result


def test_a_setup_step_that_fails_once_is_tried_again_and_twice_is_the_systems_failure(monkeypatch, tmp_path):
    run_program("pass")  # the boundary checked once, with the real launcher
    flag = tmp_path / "failed-once"
    once = launcher_with(tmp_path, "        source = self.build_root()\n",
                         f"        if not os.path.exists({str(flag)!r}):\n            open({str(flag)!r}, 'w').close()\n"
                         "            raise OSError(11, 'Resource temporarily unavailable')\n        source = self.build_root()\n")  # fmt: skip
    monkeypatch.setattr("localcos.eval.sandbox._LAUNCHER", once)
    outcome = run_program("pass", LIMITS)
    assert outcome.passed and flag.exists()
    always = launcher_with(
        tmp_path, "        source = self.build_root()\n", "        raise OSError(11, 'Resource temporarily unavailable')\n"
    )
    monkeypatch.setattr("localcos.eval.sandbox._LAUNCHER", always)
    with pytest.raises(
        SandboxUnavailable, match="could not be built for a program, twice: BlockingIOError: .*Resource temporarily unavailable"
    ):
        run_program("pass", LIMITS)


def test_a_launcher_that_cannot_start_leaves_no_descriptor_open(monkeypatch):
    run_program("pass")

    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    before = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr("localcos.eval.sandbox.subprocess.Popen", refuse)
    with pytest.raises(OSError, match="Too many open files"):
        run_program("pass", LIMITS)
    assert sorted(os.listdir("/proc/self/fd")) == before


# takes all it can of what the kernel charges to the host's root for the box's user, then holds it a while
HOG = (
    "import ctypes, os, signal, time\nlibc = ctypes.CDLL(None, use_errno=True)\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\n"
    "queued = 0\nwhile queued < 200000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0:\n    queued += 1\n"
    "timers = 0\nwhile timers < 200000 and libc.timer_create(1, None, ctypes.byref(ctypes.c_void_p())) == 0:\n    timers += 1\n"
    "held = [libc.inotify_init() for _ in range(200)] + [libc.fanotify_init(0, 0) for _ in range(200)]\n"
    "time.sleep(1.2)\nraise RuntimeError('queued %d, timers %d, inotify or fanotify %d' % (queued, timers, sum(h >= 0 for h in held)))\n"
)  # fmt: skip


def test_the_hosts_root_keeps_its_signal_queue_inotify_and_fanotify_while_a_program_hogs_them(tmp_path):
    import concurrent.futures
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    receiver = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\n"
                                 "print(1, flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert receiver.stdout is not None and receiver.stdout.readline() == b"1\n"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(run_program, HOG, Limits(seconds=5.0, memory_mb=512))
            time.sleep(1.0)  # the program has started and taken what it could
            ours = {
                "sigqueue": libc.sigqueue(receiver.pid, signal.SIGRTMIN, ctypes.c_void_p(0)),
                "inotify_init": libc.inotify_init(),
                "fanotify_init": libc.fanotify_init(0, 0) if os.geteuid() == 0 else 0,  # needs CAP_SYS_ADMIN: root's, as in CI
            }
            ours["inotify_add_watch"] = libc.inotify_add_watch(ours["inotify_init"], str(tmp_path).encode(), 0x100)
            outcome = running.result()
        for name in ("inotify_init", "fanotify_init"):
            if ours[name] > 0:
                os.close(ours[name])
    finally:
        receiver.kill()
        receiver.wait()
    assert all(result >= 0 for result in ours.values()), ours
    assert outcome.result == "failed: RuntimeError: queued 64, timers 0, inotify or fanotify 0", outcome.result


# --- through `localcos eval`: every program in a task file, one line per problem, eval goes on --------


@pytest.mark.slow
def test_eval_contains_every_hostile_program_of_a_task_file_and_counts_no_forged_pass(models, world, tmp_path):
    # infilling tasks: whatever the model writes is closed in a string, and the code comes after it, in the program
    head = 'def f():\n    return 1\n\n\nwritten = """'
    tasks = [{"task_id": f"hostile/{name}", "prompt": head, "suffix": '"""\n' + hostile(name, world) + "\n",
              "test": "def check(candidate):\n    assert candidate() == 1\n", "entry_point": "f"}
             for name in HOSTILE if name not in ("hangs", "sleeps", "forks forever")]  # fmt: skip
    wrong = {f"{kind}/{name}": completion for kind, programs in (("early", FALSE_PASSES), ("forged", FORGERS)) for name, completion in programs.items()}
    tasks += [{"task_id": task_id, "prompt": head, "suffix": '"""\n\ndef double(x):\n' + completion + "\n", "test": TASK.test, "entry_point": "double"}
              for task_id, completion in wrong.items()]  # fmt: skip
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    results = tmp_path / "results.jsonl"
    before = world.state()
    proc = subprocess.run([sys.executable, "-m", "localcos", "eval", "--models", str(models["fim"]), "--task", str(task_file), "--run-code",
                           "--timeout", "2", "--max-tokens", "4", "--results", str(results), "--variant", "alone=--combine we"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "localcos: each program's memory: 1024 MiB of address space per process" in proc.stderr  # which bound applies, said once
    lines = results.read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    assert header["sandbox"] == "namespaces" and len(records) == len(tasks)
    assert not [r["task_id"] for r in records if r["passed"] and not r["task_id"].startswith("hostile/")]
    by = {r["task_id"]: r for r in records}
    assert [name for name in HARMLESS_INSIDE if not by[f"hostile/{name}"]["passed"]] == [], by  # the program ran, and its test with it
    assert all("\n" not in r["result"] and "SECRET" not in r["result"] for r in records)
    # a program that writes a setup failure to every descriptor fails alone, and the problems after it ran
    assert by["hostile/forges a setup failure"]["result"] == SAYS["forges a setup failure"]
    assert list(by).index("hostile/forges a setup failure") < len(records) - 1
    time.sleep(2.0)  # late writers
    assert_contained(world, before, type("O", (), {"result": ""})(), "eval")
