"""The launcher of one sandboxed program (`eval.sandbox`): run by path as
`python -I -S launcher.py CONFIG CONTROL_FD` (CONFIG: a dict, `marshal`led, in hex), the
standard library only (it imports nothing of localcos, nothing outside the Python installation,
and little of it: its start is part of every program's cost).

Five processes, each unable to outlive the one that forked it:
- P, the launcher itself, a child of the harness (a parent-death signal, checked after it is
  set, so a parent that died first is seen). Where the harness made a memory cgroup for the run,
  P joins it first, so everything of the run is counted there. It forks C and, for a contained
  program, writes C's user and group id maps (only a process outside C's user namespace may map
  root to nobody).
- C enters new user, mount, PID, network, IPC and UTS namespaces, builds the new root and forks
  I, dying with P the same way.
- I, eval's init: process 1 of the new PID namespace (when it ends, the kernel kills every
  process of the namespace), dying with C (its parent-death signal is its own: no program can
  clear it). It sends the harness a pidfd of itself, so the harness can end the namespace and
  wait until it is gone; forks the program's process G, then the judge's process J, reaps every
  process of the namespace, and once the verdict is known reports it (`watch`).
- G becomes the unprivileged user with no capabilities and no new privileges, installs a
  seccomp filter (`seccomp_filter`) and executes the program's driver (crossing.serve): a
  process like any other, which a signal it sends itself ends.
- J, forked from I after G, becomes the same user under the same limits and filter and runs the
  test there (crossing.judge), without a new interpreter: the test calls the program's
  functions through a stream socket pair whose other end G holds, plain data each way.

CONTROL_FD is a Unix socket (SOCK_SEQPACKET) to the harness, the launcher's one channel:
"setup: WHY" where the boundary could not be built, "program" with the pidfd whose end ends the
program, and "ended G_STATUS G_CPU J_STATUS J_CPU PASSED" (then J's line, where the test failed)
once the verdict is known. G and J close it as they start, so nothing the program does can speak
on it.

The verdict: J alone holds the verdict channel (a socket pair whose other end I keeps; G never
has it, nor J's memory: no ptrace, process_vm_*, pidfd_getfd or /proc in the box). Once the
test's last statement returned, J sends the per-run nonce and exits 0; where it failed, "failed
LINE". I reads what came with the kernel's word for who sent it (SCM_CREDENTIALS): PASSED is 1
when the nonce came from J's own process id and J exited with status 0. Where J says nothing
(G ended first, or broke the channel), I waits for G too, and G's end says why.

Uncontained (`--sandbox none`), P is the one that forks G and J and watches them, with the same limits, no
namespaces and no filter.
"""

from __future__ import annotations

import _socket
import ctypes
import marshal
import os
import resource
import select
import signal
import struct
import sys

TYPE_CHECKING = False  # typing's import is most of what this module would import
if TYPE_CHECKING:
    from typing import Any, NoReturn

SETUP_FAILED = 125  # P's exit status when the boundary could not be built

# -- seccomp: system calls a program is refused ------------------------------------------------------

# (AUDIT_ARCH_*, the numbers of the calls below) for each processor architecture the filter knows;
# elsewhere the contained sandbox refuses to run (the harness says so before any model loads)
_NAMES = ("socket", "socketpair", "clone", "clone3", "unshare", "setns", "shmget", "msgget", "semget", "mq_open",
          "memfd_create", "io_uring_setup", "pivot_root", "keyctl", "setsockopt", "fcntl", "ptrace", "process_vm_readv",
          "process_vm_writev", "pidfd_getfd", "add_key", "request_key", "perf_event_open", "userfaultfd", "fanotify_init",
          "inotify_init1", "name_to_handle_at", "open_by_handle_at", "personality", "sync", "syncfs", "flock",
          "fadvise64", "preadv2", "pwritev2", "mincore", "readahead", "cachestat", "inotify_init", "modify_ldt")  # fmt: skip
_GENERIC = (198, 199, 220, 435, 97, 268, 194, 186, 190, 180, 279, 425, 41, 219, 208, 25, 117, 270, 271, 438,
            217, 218, 241, 282, 262, 26, 264, 265, 92, 81, 267, 32, 223, 286, 287, 232, 213, 451)  # asm-generic/unistd.h (no inotify_init, no modify_ldt)
_X86_64 = (41, 53, 56, 435, 272, 308, 29, 68, 64, 240, 319, 425, 155, 250, 54, 72, 101, 310, 311, 438,
           248, 249, 298, 323, 300, 294, 303, 304, 135, 162, 306, 73, 221, 327, 328, 27, 187, 451, 253, 154)  # asm/unistd_64.h
ARCHITECTURES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, dict(zip(_NAMES, _X86_64))),
    "aarch64": (0xC00000B7, dict(zip(_NAMES, _GENERIC))),
    "arm64": (0xC00000B7, dict(zip(_NAMES, _GENERIC))),
    "riscv64": (0xC00000F3, dict(zip(_NAMES, _GENERIC))),
}
# refused outright: besides round 3's (memory held outside the address space, namespaces, reaching
# around the filter or into another process), round 4's: the key calls (request_key starts
# /sbin/request-key as root in the host's namespaces), the calls a container's default profile
# refuses (perf_event_open, userfaultfd, modify_ldt, file handles, personality, sync), and what
# watches or locks the host's live files bound read-only into the box (inotify, fanotify, flock;
# POSIX locks in `fcntl`): its instances, watches and groups would also count against the
# host's root, whom the kernel charges for the box's user; and what probes or evicts the page
# cache of those files (fadvise, preadv2/pwritev2 with RWF_NOWAIT, mincore, readahead,
# cachestat): which of the host's files were used lately
_DENIED = ("shmget", "msgget", "semget", "mq_open", "memfd_create", "io_uring_setup", "unshare", "setns", "ptrace",
           "process_vm_readv", "process_vm_writev", "pidfd_getfd", "keyctl", "add_key", "request_key", "perf_event_open",
           "userfaultfd", "modify_ldt", "fanotify_init", "inotify_init", "inotify_init1", "name_to_handle_at",
           "open_by_handle_at", "personality", "sync", "syncfs", "flock", "fadvise64", "preadv2", "pwritev2", "mincore", "readahead",
           "cachestat")  # fmt: skip
_X32_BIT = 0x40000000  # x86_64: the x32 ABI's calls, refused as a whole
_AF_UNIX = 1
_CLONE_NEW = 0x7E020080  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
# SOL_SOCKET's SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE (the same on every architecture above)
_SOL_SOCKET, _BUFFER_SIZES = 1, (7, 8, 32, 33)
_F_SETPIPE_SZ = 1031
_F_LOCKS = (6, 7, 37, 38)  # F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW (the same on every architecture above)
_SIGNALS_PENDING = 64  # real-time signals and POSIX timers a program may hold queued
# no core file: a limit of 1, not 0, since where core_pattern pipes a crash to a helper (apport,
# systemd-coredump) the kernel starts it as root on the host whatever the limit, unless it is 1
_NO_CORE = (1, 1)
_EPERM, _ENOSYS = 1, 38
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _arg(i: int) -> int:
    """The offset of a call's argument `i` (its low word: every architecture above is little-endian) in seccomp_data."""
    return 16 + 8 * i


def seccomp_filter(machine: str) -> bytes:
    """The classic-BPF program G installs before the program runs: a program may create only
    Unix sockets (no AF_VSOCK, netlink, packet or IP socket: the network namespace isolates IP,
    not the others), may not enter or make namespaces (a user namespace of its own would let it
    mount a file system of unbounded size), and may not hold memory outside its address space
    (System V shared memory, message queues and semaphores, POSIX message queues, memfd, socket
    buffers or pipes grown past the system's defaults), reach around the filter (io_uring) or
    into another process of its namespace (ptrace, process_vm_*, pidfd_getfd: eval's init runs
    there), start the kernel's helpers (the key calls), or watch, lock or probe the page cache of the
    host's files it reads (inotify, fanotify, flock, POSIX locks; fadvise, preadv2, mincore,
    readahead, cachestat); nor the calls a container's default profile
    refuses (`_DENIED`). clone3 says ENOSYS, so the C library falls back to clone, whose flags the
    filter can read; every other refusal is EPERM. Calls of another ABI (i386 on x86_64, x32)
    are refused as a whole."""
    arch, nr = ARCHITECTURES[machine]
    code: list[tuple[int, Any, Any, int]] = [(_LD_W_ABS, 0, 0, 4), (_JEQ, 0, "deny", arch), (_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        code.append((_JGE, "deny", 0, _X32_BIT))
    code += [(_JEQ, "deny", 0, nr[name]) for name in _DENIED if name in nr]
    code += [(_JEQ, "enosys", 0, nr["clone3"]), (_JEQ, "socket", 0, nr["socket"]), (_JEQ, "socket", 0, nr["socketpair"]),
             (_JEQ, "clone", 0, nr["clone"]), (_JEQ, "setsockopt", 0, nr["setsockopt"]), (_JEQ, "fcntl", 0, nr["fcntl"]),
             (_RET, 0, 0, _RET_ALLOW)]  # fmt: skip
    labels = {"socket": len(code)}
    code += [(_LD_W_ABS, 0, 0, _arg(0)), (_JEQ, "allow", "deny", _AF_UNIX)]
    labels["clone"] = len(code)
    code += [(_LD_W_ABS, 0, 0, _arg(0)), (_JSET, "deny", "allow", _CLONE_NEW)]
    labels["setsockopt"] = len(code)
    code += [(_LD_W_ABS, 0, 0, _arg(1)), (_JEQ, 0, "allow", _SOL_SOCKET), (_LD_W_ABS, 0, 0, _arg(2))]
    code += [(_JEQ, "deny", 0, size) for size in _BUFFER_SIZES] + [(_RET, 0, 0, _RET_ALLOW)]
    labels["fcntl"] = len(code)
    code += [(_LD_W_ABS, 0, 0, _arg(1))] + [(_JEQ, "deny", 0, command) for command in (_F_SETPIPE_SZ, *_F_LOCKS)]
    code.append((_RET, 0, 0, _RET_ALLOW))
    labels.update(allow=len(code), deny=len(code) + 1, enosys=len(code) + 2)
    code += [(_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, _RET_ERRNO | _EPERM), (_RET, 0, 0, _RET_ERRNO | _ENOSYS)]

    def offset(at: int, target: Any) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(struct.pack("=HBBI", op, offset(i, jt), offset(i, jf), k) for i, (op, jt, jf, k) in enumerate(code))


# -- the four processes ------------------------------------------------------------------------------

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 38, 22, 2
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)  # fmt: skip
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
# statvfs's ST_* bits of the flags a bind's remount must keep (the kernel locks them on a mount
# a user namespace did not make) and the MS_* bit each is; the atime flags a remount keeps by itself
_LOCKED = ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC))
_MNT_DETACH = 2
_KEYCTL_JOIN_SESSION_KEYRING = 1
_UCRED = struct.Struct("3i")  # pid, uid, gid: SCM_CREDENTIALS' data
_MESSAGES = 64  # the most messages read from the verdict channel
_SAID = 4096  # the longest word of J's read

libc = ctypes.CDLL(None, use_errno=True)


class _Fail(Exception):
    """A step of building the boundary failed: reported as a setup failure, never as the program's."""


class Launcher:
    def __init__(self, cfg: dict[str, Any], control: int) -> None:
        self.cfg = cfg
        self.control = _socket.socket(fileno=control)
        self.machine = os.uname().machine
        self.crossing = ""  # crossing.py's source: G's driver, and J's
        self.judged: dict[str, Any] = {}  # the test, the task's own code and the entry point (harness's judge.marshal)

    def say(self, text: str, fds: tuple[int, ...] = ()) -> None:
        rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
        self.control.sendmsg([text.encode("utf-8", "replace")], rights)

    # -- P --

    def main(self) -> NoReturn:
        try:
            resource.setrlimit(resource.RLIMIT_CORE, _NO_CORE)
            self.die_with_parent(self.cfg["harness"])
            self.read_inputs()
            if self.cfg["cgroup"] is not None:  # before any fork: every process of the run is counted there
                try:
                    with open(os.path.join(self.cfg["cgroup"], "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
                except OSError as e:
                    raise _Fail(f"joining the run's memory cgroup: {e.strerror}") from None
            if self.cfg["contain"]:
                self.parent()
            else:
                os.chdir(self.cfg["folder"])
                self.init(None)
        except BaseException as e:  # whatever failed: one line, as a setup failure
            self.fail(e)
        os._exit(0)

    def read_inputs(self) -> None:
        """crossing.py's source, and what J judges with (read, then deleted: never in the program's reach)."""
        with open(self.cfg["crossing"], encoding="utf-8") as f:
            self.crossing = f.read()
        path = os.path.join(self.cfg["folder"], "judge.marshal")
        with open(path, "rb") as f:
            self.judged = marshal.loads(f.read())
        os.unlink(path)

    def fail(self, e: BaseException) -> NoReturn:
        why = str(e) if isinstance(e, _Fail) else f"{type(e).__name__}: {e}"
        try:
            self.say("setup: " + why.replace("\n", " "))
        finally:
            os._exit(SETUP_FAILED)

    def die_with_parent(self, parent: int) -> None:
        """SIGKILL when the parent (`parent`, its id) ends; and end now if it already has."""
        self.check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(parent-death signal)")
        if os.getppid() != parent:
            os._exit(SETUP_FAILED)

    def parent(self) -> None:
        up_read, up_write = os.pipe()  # C -> P: "u", C has its namespaces
        down_read, down_write = os.pipe()  # P -> C: "g", the id maps are written
        me = os.getpid()
        child = os.fork()
        if child == 0:
            os.close(up_read)
            os.close(down_write)
            try:
                self.contain(me, up_write, down_read)
            except BaseException as e:
                self.fail(e)
            os._exit(0)
        os.close(up_write)
        os.close(down_read)
        if os.read(up_read, 1) == b"u":
            self.write_id_maps(child)
            os.write(down_write, b"g")
        os.close(down_write)
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)

    def write_id_maps(self, child: int) -> None:
        uid, gid = self.cfg["uid"], self.cfg["gid"]
        if self.cfg["root"]:
            maps = (f"0 0 1\n{uid} {uid} 1\n", f"0 0 1\n{gid} {gid} 1\n")
        else:
            with open(f"/proc/{child}/setgroups", "w") as f:
                f.write("deny")
            maps = (f"{uid} {uid} 1\n", f"{gid} {gid} 1\n")
        for name, text in zip(("uid_map", "gid_map"), maps):
            try:
                with open(f"/proc/{child}/{name}", "w") as f:
                    f.write(text)
            except OSError as e:
                raise _Fail(f"writing the {name}: {e.strerror}") from None

    # -- C --

    def contain(self, parent: int, up: int, down: int) -> None:
        self.die_with_parent(parent)
        self.check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS),
                   "unshare(user, mount, pid, network, ipc, uts namespaces)")  # fmt: skip
        os.write(up, b"u")
        if os.read(down, 1) != b"g":
            raise _Fail("the id maps were not written")
        os.close(up)
        os.close(down)
        source = self.build_root()
        alive_read, alive_write = os.pipe()  # I's way to see that C ended before I could set its death signal
        init = os.fork()  # the first process of the new PID namespace: its process 1
        if init == 0:
            os.close(alive_write)
            self.check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(parent-death signal)")
            if select.select([alive_read], [], [], 0)[0]:  # end of file: C, the only writer, has ended
                os._exit(SETUP_FAILED)
            os.close(alive_read)
            self.init(source)
        os.close(alive_read)
        _, status = os.waitpid(init, 0)
        os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)

    def build_root(self) -> bytes:
        """The new root, read-only, holding only what Python needs, and the program's folder;
        returns the program's source (read before the old root goes)."""
        new = self.cfg["new_root"]
        self.mount(None, "/", None, _MS_REC | _MS_PRIVATE, None, "making the mounts private")
        self.mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755", "mounting the new root")
        for path in self.cfg["read_only"]:
            if os.path.islink(path):
                os.makedirs(os.path.dirname(new + path), exist_ok=True)
                os.symlink(os.readlink(path), new + path)
            elif os.path.exists(path):
                self.bind(path, new)
        for path in self.cfg["devices"]:  # read-only binds: writing to /dev/null works, changing its times does not
            if os.path.exists(path):
                self.bind(path, new)
        os.makedirs(new + "/sandbox")
        mb, uid, gid = self.cfg["folder_mb"], self.cfg["uid"], self.cfg["gid"]
        # an inode per page of its size: a folder of empty files holds kernel memory in proportion to its size
        self.mount("tmpfs", new + "/sandbox", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={mb}m,nr_inodes={mb * 256},mode=0700,uid={uid},gid={gid}",
                   "mounting the program's folder")  # fmt: skip
        with open(os.path.join(self.cfg["folder"], "program.py"), "rb") as f:
            source = f.read()
        os.chdir(new)
        self.check(libc.syscall(ARCHITECTURES[self.machine][1]["pivot_root"], b".", b"."), "pivot_root")
        self.check(libc.umount2(b".", _MNT_DETACH), "detaching the old root")
        os.chdir("/")
        self.mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None, "making the new root read-only")
        libc.sethostname(b"sandbox", 7)
        return source

    def bind(self, path: str, new: str) -> None:
        target = new + path
        try:
            if os.path.isdir(path):
                os.makedirs(target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "w").close()
        except OSError as e:
            raise _Fail(f"a mount point for {path}: {e.strerror}") from None
        self.mount(path, target, None, _MS_BIND, None, "binding " + path)
        flags = os.statvfs(path).f_flag
        kept = sum(ms for st, ms in _LOCKED if flags & st)
        self.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | kept, None, f"making {path} read-only")

    # -- I (P where uncontained) --

    def init(self, source: bytes | None) -> NoReturn:
        """Fork G, then J, reap every process until the verdict is known, and report it (`watch`)."""
        verdict, verdict_judge = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        verdict.setsockopt(_socket.SOL_SOCKET, _socket.SO_PASSCRED, 1)  # every message then says who sent it
        calls, calls_program = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        me = os.getpid()
        program = os.fork()
        if program == 0:
            for end in (verdict, verdict_judge, calls):
                end.close()
            if source is None:
                self.die_with_parent(me)
            self.program(source, calls_program.fileno())
        judge = os.fork()
        if judge == 0:
            verdict.close()
            calls_program.close()
            if source is None:
                self.die_with_parent(me)
            self.judge(source is not None, calls.fileno(), verdict_judge, program)
        for end in (verdict_judge, calls, calls_program):
            end.close()
        try:  # the harness ends the run by this pidfd: I's end ends the namespace; uncontained, G's
            pidfd = os.pidfd_open(program if source is None else me)
        except (AttributeError, OSError):  # kernels before 5.3: the parent-death signals alone
            pidfd = None
        if pidfd is not None:
            self.say("program", (pidfd,))
            os.close(pidfd)
        self.watch(program, judge, verdict)
        os._exit(0)

    def watch(self, program: int, judge: int, verdict: _socket.socket) -> None:
        """Reap every process that ends (as process 1 must: orphans are its children) until J
        has ended, and G too unless J decided (passed, or a failure of the test's); then report
        how G and J ended, whether J passed (the nonce, from J's own process id, and J's exit
        status 0), and J's line where the test failed."""
        nonce = self.cfg["nonce"].encode()
        ended: dict[int, tuple[int, float]] = {}
        said = b""
        while judge not in ended or (program not in ended and said != nonce and not said.startswith(b"failed ")):
            pid, status, usage = os.wait4(-1, 0)
            if pid in (program, judge):
                ended[pid] = (status, usage.ru_utime + usage.ru_stime)
            if pid == judge:
                said = self.hear(verdict, judge)
        g_status, g_cpu = ended.get(program, ("-", 0.0))
        j_status, j_cpu = ended[judge]
        returned = said == nonce and os.WIFEXITED(j_status) and os.WEXITSTATUS(j_status) == 0
        line = said[7:].decode("utf-8", "replace") if said.startswith(b"failed ") else ""
        self.say(f"ended {g_status} {g_cpu:.3f} {j_status} {j_cpu:.3f} {int(returned)}\n{line}")

    @staticmethod
    def hear(verdict: _socket.socket, judge: int) -> bytes:
        """J's word (its first message from its own process id), or b"" if it said none."""
        verdict.setblocking(False)
        for _ in range(_MESSAGES):  # bounded
            try:
                data, ancillary, _, _ = verdict.recvmsg(_SAID, _socket.CMSG_SPACE(_UCRED.size))
            except ConnectionResetError:
                continue
            except (BlockingIOError, InterruptedError):
                break
            sender = next((_UCRED.unpack(d)[0] for level, kind, d in ancillary
                           if level == _socket.SOL_SOCKET and kind == _socket.SCM_CREDENTIALS and len(d) == _UCRED.size), None)  # fmt: skip
            if sender == judge:
                return data
        return b""

    # -- G and J --

    def program(self, source: bytes | None, channel: int) -> NoReturn:
        """G: the unprivileged user, the limits, the filter, then the program's driver
        (crossing.serve; never returns)."""
        try:
            if source is not None:
                self.unprivileged()
                with open("program.py", "wb") as f:
                    f.write(source)
            self.confine(source is not None)
            # closed as the driver starts: nothing the program does can speak on the launcher's channel
            os.set_inheritable(self.control.fileno(), False)
            os.set_inheritable(channel, True)
            driver = self.crossing + "\nserve(int(sys.argv[1]))\n"
            os.execve(self.cfg["python"], [self.cfg["python"], "-I", "-X", "utf8", "-c", driver, str(channel)], self.cfg["env"])
        except BaseException as e:
            self.fail(e)

    def judge(self, contained: bool, channel: int, verdict: _socket.socket, program: int) -> NoReturn:
        """J: the unprivileged user, the limits and the filter too (the test is a file's, not
        localcos's), then the test, run here against G's answers (crossing.judge); its word to I
        is the nonce where the test's last statement returned, else "failed LINE" (or nothing:
        G ended first, and G's end says why)."""
        try:
            if contained:
                self.unprivileged()
            self.confine(contained)
        except BaseException as e:
            self.fail(e)
        self.control.close()
        crossing: dict[str, Any] = {"__name__": "crossing"}
        try:
            exec(compile(self.crossing, "crossing.py", "exec"), crossing)
            judged = self.judged
            said = crossing["judge"](channel, judged["test"], judged["context"], judged["entry_point"], program)
        except BaseException as e:
            said = f"the judge: {type(e).__name__}: {e}"
        if said is None:
            verdict.send(self.cfg["nonce"].encode())
            os._exit(0)
        if said != crossing.get("ENDED"):
            verdict.send(("failed " + said.replace("\n", " ")).encode("utf-8", "replace")[:_SAID])
        os._exit(1)

    def unprivileged(self) -> None:
        """The box's user, no capabilities, no new privileges, a keyring of its own, in the program's folder."""
        cfg = self.cfg
        if cfg["root"]:
            os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        self.check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no new privileges)")
        if libc.syscall(ARCHITECTURES[self.machine][1]["keyctl"], _KEYCTL_JOIN_SESSION_KEYRING, None) < 0 and ctypes.get_errno() != _ENOSYS:
            raise _Fail("a keyring of its own: " + os.strerror(ctypes.get_errno()))
        os.chdir("/sandbox")

    def confine(self, contained: bool) -> None:
        self.limit()
        if contained:
            self.install_filter()

    def limit(self) -> None:
        cfg, mb = self.cfg, 1 << 20
        cpu = cfg["cpu_seconds"]
        for what, soft, hard in (
            (resource.RLIMIT_AS, cfg["memory_mb"] * mb, cfg["memory_mb"] * mb),
            (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the limit, SIGKILL a second later if it is caught
            (resource.RLIMIT_FSIZE, cfg["file_mb"] * mb, cfg["file_mb"] * mb),
            (resource.RLIMIT_NOFILE, cfg["open_files"], cfg["open_files"]),
            (resource.RLIMIT_NPROC, cfg["processes"], cfg["processes"]),
            (resource.RLIMIT_MSGQUEUE, 0, 0),
            (resource.RLIMIT_MEMLOCK, 0, 0),
            (resource.RLIMIT_CORE, *_NO_CORE),
            # the kernel charges queued signals to the box's user and to the host's root above it:
            # bounded here, a program takes at most this many of root's
            (resource.RLIMIT_SIGPENDING, _SIGNALS_PENDING, _SIGNALS_PENDING),
        ):
            resource.setrlimit(what, (soft, hard))

    def install_filter(self) -> None:
        program = seccomp_filter(self.machine)
        buffer = ctypes.create_string_buffer(program, len(program))

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = Fprog(len(program) // 8, ctypes.addressof(buffer))
        self.check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "installing the seccomp filter")

    # -- helpers --

    @staticmethod
    def check(result: int, what: str) -> None:
        if result != 0:
            raise _Fail(f"{what}: {os.strerror(ctypes.get_errno())}")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None, what: str) -> None:
        def enc(s: str | None) -> bytes | None:
            return None if s is None else s.encode()

        self.check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), what)


if __name__ == "__main__":
    Launcher(marshal.loads(bytes.fromhex(sys.argv[1])), int(sys.argv[2])).main()
