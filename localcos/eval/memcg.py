"""One memory cgroup per sandboxed run (`eval.sandbox`), where this process can make one: the
run's processes, the kernel memory they hold included, then share one bound.

A cgroup can be had where this process may make a child of its own memory cgroup: as root on
cgroup v1's memory hierarchy, or on cgroup v2 where its cgroup delegates the memory controller
(`memory` in its `cgroup.subtree_control`: the root of a container's cgroup namespace, a
systemd unit with `Delegate=`). Elsewhere (an ordinary user on a systemd machine, whose shell
sits in a leaf of its user slice) none can, and each process's address space is the only bound.

A run's cgroup is named `localcos-eval-PID-N` (PID: this process), so that one left by an eval
that was killed is removed the next time eval runs (`sweep`).
"""

from __future__ import annotations

import itertools
import os
import re
import time
from dataclasses import dataclass
from functools import cache

PREFIX = "localcos-eval-"
_LEFT = re.compile(re.escape(PREFIX) + r"(\d+)-")
_REMOVE_TRIES = 50  # rmdir of a cgroup whose last process is still being torn down: a few ms each


@dataclass(frozen=True)
class Cgroup:
    """A memory cgroup: its folder, of cgroup `version` 1 or 2."""

    folder: str
    version: int

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of this cgroup for memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.folder, name), encoding="utf-8") as f:
                counts = dict(line.split()[:2] for line in f if len(line.split()) >= 2)
        except OSError:
            return False
        return int(counts.get("oom_kill", "0")) > 0

    def remove(self) -> None:
        """Remove it once the last of its processes has gone (a bounded wait)."""
        for _ in range(_REMOVE_TRIES):
            try:
                os.rmdir(self.folder)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.002)


@cache
def hierarchy() -> Cgroup | None:
    """The memory cgroup under which this process can make a run's cgroup (checked by making
    and removing one), or None where it cannot."""
    for place in _candidates():
        probe = Cgroup(os.path.join(place.folder, f"{PREFIX}{os.getpid()}-probe"), place.version)
        try:
            os.mkdir(probe.folder)
        except OSError:
            continue
        try:
            _limit(probe, 64 << 20)
            return place
        except OSError:
            continue
        finally:
            probe.remove()
    return None


def _candidates() -> list[Cgroup]:
    """This process's memory cgroup folders, v2 first: the cgroup file's path under each
    hierarchy's mount point."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for m in mounts:
            fstype = m[m.index("-") + 1]
            v2 = controllers == "" and fstype == "cgroup2"
            v1 = "memory" in controllers.split(",") and fstype == "cgroup" and "memory" in m[-1].split(",")
            if not (v2 or v1):
                continue
            root, point = m[3], m[4]
            if not (path == root or path.startswith(root.rstrip("/") + "/")):
                continue  # another namespace's view of the hierarchy
            folder = os.path.join(point, path[len(root):].lstrip("/"))
            if v2:
                try:
                    with open(os.path.join(folder, "cgroup.subtree_control"), encoding="utf-8") as f:
                        if "memory" not in f.read().split():
                            continue
                except OSError:
                    continue
            found.append(Cgroup(folder, 2 if v2 else 1))
    return sorted(found, key=lambda h: -h.version)


_numbers = itertools.count()


def make(memory_bytes: int) -> Cgroup | None:
    """A new cgroup for one run, its memory (swap none) bounded by `memory_bytes`; None where no
    cgroup can be had. Raises OSError where making one fails where it had worked."""
    place = hierarchy()
    if place is None:
        return None
    group = Cgroup(os.path.join(place.folder, f"{PREFIX}{os.getpid()}-{next(_numbers)}"), place.version)
    os.mkdir(group.folder)
    try:
        _limit(group, memory_bytes)
    except OSError:
        group.remove()
        raise
    return group


def _limit(group: Cgroup, memory_bytes: int) -> None:
    if group.version == 2:
        _put(group, "memory.max", memory_bytes)
        _put(group, "memory.swap.max", 0, optional=True)
        _put(group, "memory.oom.group", 1, optional=True)  # one process out of memory ends the run
    else:
        _put(group, "memory.limit_in_bytes", memory_bytes)
        _put(group, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # only once the limit is set


def _put(group: Cgroup, name: str, value: int, optional: bool = False) -> None:
    try:
        with open(os.path.join(group.folder, name), "w", encoding="utf-8") as f:
            f.write(str(value))
    except OSError:
        if not optional:
            raise


def sweep() -> None:
    """Remove the cgroups that runs of an eval no longer alive left (one killed mid-run)."""
    place = hierarchy()
    if place is None:
        return
    try:
        names = os.listdir(place.folder)
    except OSError:
        return
    for name in names:
        left = _LEFT.match(name)
        if left and not alive(int(left.group(1))):
            Cgroup(os.path.join(place.folder, name), place.version).remove()


def alive(pid: int) -> bool:
    """Whether a process `pid` exists (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
