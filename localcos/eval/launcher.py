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
  clear it). It handles no signal (`deaf`: process 1 then receives none from inside), sends the
  harness a pidfd of itself, so the harness can end the namespace and wait until it is gone;
  forks the program's process G, then the judge's process J, reaps every process of the
  namespace, and once the verdict is known reports it (`watch`).
- G becomes the unprivileged user with no capabilities and no new privileges, installs a
  seccomp filter (`seccomp_filter`) and executes the program's driver (crossing.serve): a
  process like any other, which a signal it sends itself ends.
- J, forked from I after G, becomes the same user with no capabilities under the same limits and
  filter, in the read-only root, and runs the test there (crossing.judge), without a new
  interpreter: the test calls the program's functions through a stream socket pair whose other
  end G holds, plain data each way. G starts the program only once J is set up. J's
  environment is the box's (the harness starts P with it), its limits are out of the program's
  reach (the filter allows prlimit64 on the caller alone).

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

# Every system call the filter names: (its number on x86_64, in asm-generic/unistd.h: aarch64's
# and riscv64's), None where that ABI has none (read from the kernel's headers; riscv64's own
# riscv_hwprobe and riscv_flush_icache are no call on aarch64, where the kernel says ENOSYS)
_NUMBERS: dict[str, tuple[int | None, int | None]] = {
    "read": (0, 63), "write": (1, 64), "open": (2, None), "close": (3, 57), "stat": (4, None), "fstat": (5, 80), "lstat": (6, None),
    "poll": (7, None), "lseek": (8, 62), "mmap": (9, 222), "mprotect": (10, 226), "munmap": (11, 215), "brk": (12, 214), "rt_sigaction": (13, 134),
    "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139), "ioctl": (16, 29), "pread64": (17, 67), "pwrite64": (18, 68), "readv": (19, 65),
    "writev": (20, 66), "access": (21, None), "pipe": (22, None), "select": (23, None), "sched_yield": (24, 124), "mremap": (25, 216),
    "msync": (26, 227), "madvise": (28, 233), "dup": (32, 23), "dup2": (33, None), "pause": (34, None), "nanosleep": (35, 101),
    "getitimer": (36, 102), "alarm": (37, None), "setitimer": (38, 103), "getpid": (39, 172), "sendfile": (40, 71), "connect": (42, 203),
    "accept": (43, 202), "sendto": (44, 206), "recvfrom": (45, 207), "sendmsg": (46, 211), "recvmsg": (47, 212), "shutdown": (48, 210),
    "bind": (49, 200), "listen": (50, 201), "getsockname": (51, 204), "getpeername": (52, 205), "getsockopt": (55, 209), "fork": (57, None),
    "vfork": (58, None), "execve": (59, 221), "exit": (60, 93), "wait4": (61, 260), "kill": (62, 129), "uname": (63, 160), "fsync": (74, 82),
    "fdatasync": (75, 83), "truncate": (76, 45), "ftruncate": (77, 46), "getdents": (78, None), "getcwd": (79, 17), "chdir": (80, 49),
    "fchdir": (81, 50), "rename": (82, None), "mkdir": (83, None), "rmdir": (84, None), "creat": (85, None), "link": (86, None),
    "unlink": (87, None), "symlink": (88, None), "readlink": (89, None), "chmod": (90, None), "fchmod": (91, 52), "chown": (92, None),
    "fchown": (93, 55), "lchown": (94, None), "umask": (95, 166), "gettimeofday": (96, 169), "getrlimit": (97, 163), "getrusage": (98, 165),
    "sysinfo": (99, 179), "times": (100, 153), "getuid": (102, 174), "getgid": (104, 176), "setuid": (105, 146), "setgid": (106, 144),
    "geteuid": (107, 175), "getegid": (108, 177), "setpgid": (109, 154), "getppid": (110, 173), "getpgrp": (111, None), "setsid": (112, 157),
    "setreuid": (113, 145), "setregid": (114, 143), "getgroups": (115, 158), "setgroups": (116, 159), "setresuid": (117, 147),
    "getresuid": (118, 148), "setresgid": (119, 149), "getresgid": (120, 150), "getpgid": (121, 155), "setfsuid": (122, 151), "setfsgid": (123, 152),
    "getsid": (124, 156), "capget": (125, 90), "capset": (126, 91), "rt_sigpending": (127, 136), "rt_sigtimedwait": (128, 137),
    "rt_sigqueueinfo": (129, 138), "rt_sigsuspend": (130, 133), "sigaltstack": (131, 132), "utime": (132, None), "mknod": (133, None),
    "statfs": (137, 43), "fstatfs": (138, 44), "getpriority": (140, 141), "setpriority": (141, 140), "sched_setparam": (142, 118),
    "sched_getparam": (143, 121), "sched_setscheduler": (144, 119), "sched_getscheduler": (145, 120), "sched_get_priority_max": (146, 125),
    "sched_get_priority_min": (147, 126), "sched_rr_get_interval": (148, 127), "mlock": (149, 228), "munlock": (150, 229), "mlockall": (151, 230),
    "munlockall": (152, 231), "prctl": (157, 167), "arch_prctl": (158, None), "adjtimex": (159, 171), "setrlimit": (160, 164), "gettid": (186, 178),
    "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7), "getxattr": (191, 8), "lgetxattr": (192, 9), "fgetxattr": (193, 10),
    "listxattr": (194, 11), "llistxattr": (195, 12), "flistxattr": (196, 13), "removexattr": (197, 14), "lremovexattr": (198, 15),
    "fremovexattr": (199, 16), "tkill": (200, 130), "time": (201, None), "futex": (202, 98), "sched_setaffinity": (203, 122),
    "sched_getaffinity": (204, 123), "set_thread_area": (205, None), "io_setup": (206, 0), "io_destroy": (207, 1), "io_getevents": (208, 4),
    "io_submit": (209, 2), "io_cancel": (210, 3), "get_thread_area": (211, None), "epoll_create": (213, None), "epoll_ctl_old": (214, None),
    "epoll_wait_old": (215, None), "remap_file_pages": (216, 234), "getdents64": (217, 61), "set_tid_address": (218, 96),
    "restart_syscall": (219, 128), "timer_create": (222, 107), "timer_settime": (223, 110), "timer_gettime": (224, 108),
    "timer_getoverrun": (225, 109), "timer_delete": (226, 111), "clock_gettime": (228, 113), "clock_getres": (229, 114),
    "clock_nanosleep": (230, 115), "exit_group": (231, 94), "epoll_wait": (232, None), "epoll_ctl": (233, 21), "tgkill": (234, 131),
    "utimes": (235, None), "waitid": (247, 95), "ioprio_set": (251, 30), "ioprio_get": (252, 31), "openat": (257, 56), "mkdirat": (258, 34),
    "mknodat": (259, 33), "fchownat": (260, 54), "futimesat": (261, None), "newfstatat": (262, 79), "unlinkat": (263, 35), "renameat": (264, 38),
    "linkat": (265, 37), "symlinkat": (266, 36), "readlinkat": (267, 78), "fchmodat": (268, 53), "faccessat": (269, 48), "pselect6": (270, 72),
    "ppoll": (271, 73), "set_robust_list": (273, 99), "get_robust_list": (274, 100), "splice": (275, 76), "tee": (276, 77),
    "sync_file_range": (277, 84), "vmsplice": (278, 75), "utimensat": (280, 88), "epoll_pwait": (281, 22), "signalfd": (282, None),
    "timerfd_create": (283, 85), "eventfd": (284, None), "fallocate": (285, 47), "timerfd_settime": (286, 86), "timerfd_gettime": (287, 87),
    "accept4": (288, 242), "signalfd4": (289, 74), "eventfd2": (290, 19), "epoll_create1": (291, 20), "dup3": (292, 24), "pipe2": (293, 59),
    "preadv": (295, 69), "pwritev": (296, 70), "rt_tgsigqueueinfo": (297, 240), "recvmmsg": (299, 243), "prlimit64": (302, 261),
    "clock_adjtime": (305, 266), "sendmmsg": (307, 269), "getcpu": (309, 168), "sched_setattr": (314, 274), "sched_getattr": (315, 275),
    "renameat2": (316, 276), "seccomp": (317, 277), "getrandom": (318, 278), "execveat": (322, 281), "membarrier": (324, 283), "mlock2": (325, 284),
    "copy_file_range": (326, 285), "statx": (332, 291), "io_pgetevents": (333, 292), "rseq": (334, 293), "pidfd_send_signal": (424, 424),
    "pidfd_open": (434, 434), "close_range": (436, 436), "openat2": (437, 437), "faccessat2": (439, 439), "epoll_pwait2": (441, 441),
    "landlock_create_ruleset": (444, 444), "landlock_add_rule": (445, 445), "landlock_restrict_self": (446, 446), "process_mrelease": (448, 448),
    "futex_waitv": (449, 449), "riscv_hwprobe": (None, 258), "riscv_flush_icache": (None, 259), "socket": (41, 198), "socketpair": (53, 199),
    "clone": (56, 220), "clone3": (435, 435), "unshare": (272, 97), "setns": (308, 268), "shmget": (29, 194), "msgget": (68, 186),
    "semget": (64, 190), "mq_open": (240, 180), "memfd_create": (319, 279), "io_uring_setup": (425, 425), "pivot_root": (155, 41),
    "keyctl": (250, 219), "setsockopt": (54, 208), "fcntl": (72, 25), "ptrace": (101, 117), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "pidfd_getfd": (438, 438), "add_key": (248, 217), "request_key": (249, 218), "perf_event_open": (298, 241),
    "userfaultfd": (323, 282), "fanotify_init": (300, 262), "inotify_init1": (294, 26), "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265), "personality": (135, 92), "sync": (162, 81), "syncfs": (306, 267), "flock": (73, 32), "fadvise64": (221, 223),
    "preadv2": (327, 286), "pwritev2": (328, 287), "mincore": (27, 232), "readahead": (187, 213), "cachestat": (451, 451),
    "inotify_init": (253, None), "modify_ldt": (154, None),
}  # fmt: skip
# (AUDIT_ARCH_*, the column of `_NUMBERS`) for each processor architecture the filter knows;
# elsewhere the contained sandbox refuses to run (the harness says so before any model loads)
_AUDIT = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1), "arm64": (0xC00000B7, 1), "riscv64": (0xC00000F3, 1)}
ARCHITECTURES: dict[str, tuple[int, dict[str, int]]] = {
    machine: (audit, {name: number for name, pair in _NUMBERS.items() if (number := pair[column]) is not None})
    for machine, (audit, column) in _AUDIT.items()
}
# what a program may call besides the calls `seccomp_filter` reads the arguments of: Docker's
# default profile for a process with no capabilities, less what is refused outright (`_DENIED`)
# and the rest of those families (System V and POSIX IPC, io_uring, inotify, fanotify,
# memfd_secret); any other call says ENOSYS, as a call the kernel lacks, so the C library falls
# back where it can
_ALLOWED = (
    "read", "write", "open", "close", "stat", "fstat", "lstat", "poll", "lseek", "mmap", "mprotect", "munmap", "brk", "rt_sigaction",
    "rt_sigprocmask", "rt_sigreturn", "ioctl", "pread64", "pwrite64", "readv", "writev", "access", "pipe", "select", "sched_yield", "mremap",
    "msync", "madvise", "dup", "dup2", "pause", "nanosleep", "getitimer", "alarm", "setitimer", "getpid", "sendfile", "connect", "accept", "sendto",
    "recvfrom", "sendmsg", "recvmsg", "shutdown", "bind", "listen", "getsockname", "getpeername", "getsockopt", "fork", "vfork", "execve", "exit",
    "wait4", "kill", "uname", "fsync", "fdatasync", "truncate", "ftruncate", "getdents", "getcwd", "chdir", "fchdir", "rename", "mkdir", "rmdir",
    "creat", "link", "unlink", "symlink", "readlink", "chmod", "fchmod", "chown", "fchown", "lchown", "umask", "gettimeofday", "getrlimit",
    "getrusage", "sysinfo", "times", "getuid", "getgid", "setuid", "setgid", "geteuid", "getegid", "setpgid", "getppid", "getpgrp", "setsid",
    "setreuid", "setregid", "getgroups", "setgroups", "setresuid", "getresuid", "setresgid", "getresgid", "getpgid", "setfsuid", "setfsgid",
    "getsid", "capget", "capset", "rt_sigpending", "rt_sigtimedwait", "rt_sigqueueinfo", "rt_sigsuspend", "sigaltstack", "utime", "mknod", "statfs",
    "fstatfs", "getpriority", "setpriority", "sched_setparam", "sched_getparam", "sched_setscheduler", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "mlock", "munlock", "mlockall", "munlockall", "prctl", "arch_prctl",
    "adjtimex", "setrlimit", "gettid", "setxattr", "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr",
    "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "tkill", "time", "futex", "sched_setaffinity", "sched_getaffinity",
    "set_thread_area", "io_setup", "io_destroy", "io_getevents", "io_submit", "io_cancel", "get_thread_area", "epoll_create", "epoll_ctl_old",
    "epoll_wait_old", "remap_file_pages", "getdents64", "set_tid_address", "restart_syscall", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "clock_gettime", "clock_getres", "clock_nanosleep", "exit_group", "epoll_wait", "epoll_ctl", "tgkill",
    "utimes", "waitid", "ioprio_set", "ioprio_get", "openat", "mkdirat", "mknodat", "fchownat", "futimesat", "newfstatat", "unlinkat", "renameat",
    "linkat", "symlinkat", "readlinkat", "fchmodat", "faccessat", "pselect6", "ppoll", "set_robust_list", "get_robust_list", "splice", "tee",
    "sync_file_range", "vmsplice", "utimensat", "epoll_pwait", "signalfd", "timerfd_create", "eventfd", "fallocate", "timerfd_settime",
    "timerfd_gettime", "accept4", "signalfd4", "eventfd2", "epoll_create1", "dup3", "pipe2", "preadv", "pwritev", "rt_tgsigqueueinfo", "recvmmsg",
    "prlimit64", "clock_adjtime", "sendmmsg", "getcpu", "sched_setattr", "sched_getattr", "renameat2", "seccomp", "getrandom", "execveat",
    "membarrier", "mlock2", "copy_file_range", "statx", "io_pgetevents", "rseq", "pidfd_send_signal", "pidfd_open", "close_range", "openat2",
    "faccessat2", "epoll_pwait2", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "process_mrelease", "futex_waitv",
    "riscv_hwprobe", "riscv_flush_icache",
)  # fmt: skip
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
# out-of-band data on a socket (the kernel's AF_UNIX code behind it had use-after-free bugs;
# Chrome's sandbox filters it too): the flags argument of each call that takes one
_MSG_OOB = 1
_FLAGS_AT = {"sendto": 3, "recvfrom": 3, "sendmsg": 2, "recvmsg": 2, "sendmmsg": 3, "recvmmsg": 3}
_SIGNALS_PENDING = 64  # real-time signals and POSIX timers a program may hold queued
# no core file: a limit of 1, not 0, since where core_pattern pipes a crash to a helper (apport,
# systemd-coredump) the kernel starts it as root on the host whatever the limit, unless it is 1
_NO_CORE = (1, 1)
_EPERM, _EINVAL, _ENOSYS = 1, 22, 38
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ, _JGT, _JGE, _JSET, _RET = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06


def _arg(i: int) -> int:
    """The offset of a call's argument `i` (its low word: every architecture above is little-endian) in seccomp_data."""
    return 16 + 8 * i


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers as (first, last) runs of consecutive ones."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [(first, last) for first, last in runs]


def seccomp_filter(machine: str) -> bytes:
    """The classic-BPF program G and J install before the test or the program runs: an allow
    list (`_ALLOWED`: anything else says ENOSYS) with, refused outright with EPERM (`_DENIED`),
    what would let a program out or cost the host: it may create only Unix sockets (no AF_VSOCK,
    netlink, packet or IP socket: the network namespace isolates IP, not the others), may not
    enter or make namespaces (a user namespace of its own would let it mount a file system of
    unbounded size), and may not hold memory outside its address space (System V shared memory,
    message queues and semaphores, POSIX message queues, memfd, socket buffers or pipes grown
    past the system's defaults), reach around the filter (io_uring) or into another process of
    its namespace (ptrace, process_vm_*, pidfd_getfd: eval's init and the judge run there), start
    the kernel's helpers (the key calls), or watch, lock or probe the page cache of the host's
    files it reads (inotify, fanotify, flock, POSIX locks; fadvise, preadv2, mincore, readahead,
    cachestat), or send or read a socket's out-of-band data (MSG_OOB), or change another
    process's limits (prlimit64 on any process but the caller: the judge and eval's init may
    share its user); nor the calls a container's default profile refuses. clone3 says ENOSYS,
    so the C library falls back to clone, whose flags the filter can read. Calls of another ABI (i386
    on x86_64, x32) are refused as a whole."""
    arch, nr = ARCHITECTURES[machine]
    code: list[tuple[int, Any, Any, int]] = [(_LD_W_ABS, 0, 0, 4), (_JEQ, 0, "deny", arch), (_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        code.append((_JGE, "deny", 0, _X32_BIT))
    code += [(_JEQ, "deny", 0, nr[name]) for name in _DENIED if name in nr]
    code += [(_JEQ, "enosys", 0, nr["clone3"]), (_JEQ, "socket", 0, nr["socket"]), (_JEQ, "socket", 0, nr["socketpair"]),
             (_JEQ, "clone", 0, nr["clone"]), (_JEQ, "setsockopt", 0, nr["setsockopt"]), (_JEQ, "fcntl", 0, nr["fcntl"]),
             (_JEQ, "own", 0, nr["prlimit64"])]  # fmt: skip
    code += [(_JEQ, f"flags{at}", 0, nr[name]) for name, at in _FLAGS_AT.items()]
    # the allowed calls as runs of consecutive numbers, lowest first: above a run, on to the next
    for first, last in _runs(sorted(nr[name] for name in _ALLOWED if name in nr)):
        code += [(_JGT, 1, 0, last), (_JGE, "allow", "enosys", first)]
    code.append((_RET, 0, 0, _RET_ERRNO | _ENOSYS))
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
    labels["own"] = len(code)
    code += [(_LD_W_ABS, 0, 0, _arg(0)), (_JEQ, "allow", "deny", 0)]
    for at in sorted(set(_FLAGS_AT.values())):
        labels[f"flags{at}"] = len(code)
        code += [(_LD_W_ABS, 0, 0, _arg(at)), (_JSET, "deny", "allow", _MSG_OOB)]
    labels.update(allow=len(code), deny=len(code) + 1, enosys=len(code) + 2)
    code += [(_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, _RET_ERRNO | _EPERM), (_RET, 0, 0, _RET_ERRNO | _ENOSYS)]

    def offset(at: int, target: Any) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(struct.pack("=HBBI", op, offset(i, jt), offset(i, jf), k) for i, (op, jt, jf, k) in enumerate(code))


# -- the four processes ------------------------------------------------------------------------------

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_CAPBSET_DROP = 1, 38, 22, 2, 24
_CAPABILITY_VERSION_3 = 0x20080522  # capset's header: three 32-bit sets, twice
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
        """Deaf to every signal a program can send, fork G, then J, reap every process until the
        verdict is known, and report it (`watch`). G runs the program only once J is set up
        (J's word on a pipe), so every setup step, G's and J's, ends before the program's first
        instruction: nothing a program does is ever reported as a setup failure. Where I fails
        after that, it ends without a verdict, which the harness counts as the program's failure."""
        python_handlers = self.deaf()
        verdict, verdict_judge = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        verdict.setsockopt(_socket.SOL_SOCKET, _socket.SO_PASSCRED, 1)  # every message then says who sent it
        calls, calls_program = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        judge_ready, judge_set_up = os.pipe()  # J -> G: "j", J is set up (closed on G's exec)
        me = os.getpid()
        program = os.fork()
        if program == 0:
            for end in (verdict, verdict_judge, calls):
                end.close()
            os.close(judge_set_up)
            if source is None:
                self.die_with_parent(me)
            self.program(source, calls_program.fileno(), judge_ready)
        judge = os.fork()
        if judge == 0:
            verdict.close()
            calls_program.close()
            os.close(judge_ready)
            for number, handler in python_handlers.items():  # the test runs as it would in Python
                signal.signal(number, handler)
            if source is None:
                self.die_with_parent(me)
            self.judge(source is not None, calls.fileno(), verdict_judge, program, judge_set_up)
        for end in (verdict_judge, calls, calls_program):
            end.close()
        os.close(judge_ready)
        os.close(judge_set_up)
        try:
            try:  # the harness ends the run by this pidfd: I's end ends the namespace; uncontained, G's
                pidfd = os.pidfd_open(program if source is None else me)
            except (AttributeError, OSError):  # kernels before 5.3: the parent-death signals alone
                pidfd = None
            if pidfd is not None:
                self.say("program", (pidfd,))
                os.close(pidfd)
            self.watch(program, judge, verdict)
        except BaseException as e:  # the program may have started: no setup failure, no verdict
            os.write(2, f"eval's init: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
            os._exit(1)
        os._exit(0)

    @staticmethod
    def deaf() -> dict[int, Any]:
        """Every catchable signal's handler set to SIG_DFL, which process 1 of a PID namespace never
        receives from inside it (Python's own, KeyboardInterrupt's among them, would run when the
        program signals process 1); returns the handlers Python had. Uncontained, P is no init: a
        signal then ends it, and the run fails for want of a verdict."""
        handlers: dict[int, Any] = {}
        for number in set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}:
            try:
                handler = signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):  # one the C library keeps for itself
                continue
            if handler is not None:  # None: one not set from Python, nothing to restore
                handlers[number] = handler
        return handlers

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

    def program(self, source: bytes | None, channel: int, judge_ready: int) -> NoReturn:
        """G: the unprivileged user, the limits, the filter, then, once J is set up, the
        program's driver (crossing.serve; never returns)."""
        try:
            if source is not None:
                self.unprivileged("/sandbox")
                with open("program.py", "wb") as f:
                    f.write(source)
            self.confine(source is not None)
            if os.read(judge_ready, 1) != b"j":  # J's setup failed, and J said why
                os._exit(SETUP_FAILED)
            # closed as the driver starts: nothing the program does can speak on the launcher's channel
            os.set_inheritable(self.control.fileno(), False)
            os.set_inheritable(channel, True)
            driver = self.crossing + "\nserve(int(sys.argv[1]))\n"
            os.execve(self.cfg["python"], [self.cfg["python"], "-I", "-X", "utf8", "-c", driver, str(channel)], self.cfg["env"])
        except BaseException as e:
            self.fail(e)

    def judge(self, contained: bool, channel: int, verdict: _socket.socket, program: int, set_up: int) -> NoReturn:
        """J: the unprivileged user in the read-only root (no file the program made is where the
        test's code looks), the limits and the filter too (the test is a file's, not
        localcos's), then the test, run here against G's answers (crossing.judge); its word to I
        is the nonce where the test's last statement returned, else "failed LINE" (or nothing:
        G ended first, and G's end says why)."""
        try:
            if contained:
                self.unprivileged("/")
            self.confine(contained)
        except BaseException as e:
            self.fail(e)
        self.control.close()
        os.write(set_up, b"j")  # the program may start
        os.close(set_up)
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

    def unprivileged(self, folder: str) -> None:
        """The box's user, no capabilities (none held, none to be had: the bounding set emptied,
        as a process that keeps its user id, an ordinary user's, keeps the user namespace's
        every one otherwise), no new privileges, a keyring of its own, in `folder`."""
        cfg = self.cfg
        if cfg["root"]:
            os.setgroups([])
        for capability in range(64):  # while CAP_SETPCAP is still held; EINVAL past the kernel's last
            if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                if ctypes.get_errno() == _EINVAL:
                    break
                raise _Fail("emptying the capability bounding set: " + os.strerror(ctypes.get_errno()))
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        header = ctypes.create_string_buffer(struct.pack("Ii", _CAPABILITY_VERSION_3, 0), 8)
        self.check(libc.capset(header, ctypes.create_string_buffer(24)), "capset(none)")  # effective, permitted, inheritable: empty
        self.check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no new privileges)")
        if libc.syscall(ARCHITECTURES[self.machine][1]["keyctl"], _KEYCTL_JOIN_SESSION_KEYRING, None) < 0 and ctypes.get_errno() != _ENOSYS:
            raise _Fail("a keyring of its own: " + os.strerror(ctypes.get_errno()))
        os.chdir(folder)

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
