"""The engine's memory cgroup, OOM-kill count and memory limit (kvwatch/boundary/oom_record.py), read
from fake /proc and cgroup trees under tmp_path: cgroup v2, v1, hybrid, v1 and v2 containers, none.
The host's own cgroups are never read."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvwatch.boundary.oom_record import MemoryCgroup, host_memory, memory_cgroup, read_oom_count
from kvwatch.values.host_memory import HostMemory, OomCount
from kvwatch.watchdog.kill_cause import kernel_record

SVC = "/system.slice/kvwatch.service"
GIB = 1 << 30
MEMINFO = "MemTotal:       131072000 kB\nMemFree:         1000000 kB\nMemAvailable:   90000000 kB\n"
OTHER_MOUNTS = ("22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
                "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n")
V2_MOUNT = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = ("24 22 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
             "30 24 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup "
             "rw,memory\n"
             "31 24 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct\n")
V1_LINES = (f"12:memory:{SVC}\n11:cpu,cpuacct:{SVC}\n1:name=systemd:{SVC}\n")


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def v2_host(root: Path, oom_kill: int = 2, limit: str = "68719476736\n") -> Path:
    leaf = f"sys/fs/cgroup{SVC}"
    return tree(root, {
        "proc/self/cgroup": f"0::{SVC}\n",
        "proc/self/mountinfo": OTHER_MOUNTS + V2_MOUNT,
        "proc/meminfo": MEMINFO,
        f"{leaf}/memory.events": f"low 0\nhigh 0\nmax 12\noom 3\noom_kill {oom_kill}\noom_group_kill 0\n",
        f"{leaf}/memory.max": limit,
        "sys/fs/cgroup/system.slice/memory.max": "max\n",
    })


def v1_host(root: Path, oom_kill: int = 1) -> Path:
    leaf = f"sys/fs/cgroup/memory{SVC}"
    return tree(root, {
        "proc/self/cgroup": V1_LINES,
        "proc/self/mountinfo": OTHER_MOUNTS + V1_MOUNTS,
        "proc/meminfo": MEMINFO,
        f"{leaf}/memory.oom_control": f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n",
        f"{leaf}/memory.limit_in_bytes": "9223372036854771712\n",        # v1's "no limit"
        "sys/fs/cgroup/memory/system.slice/memory.limit_in_bytes": f"{32 * GIB}\n",
        f"sys/fs/cgroup/cpu,cpuacct{SVC}/cpu.shares": "1024\n",
    })


def test_cgroup_v2_count_and_limit(tmp_path: Path) -> None:
    root = v2_host(tmp_path)
    cgroup = memory_cgroup(root=root)
    assert cgroup == MemoryCgroup(SVC, 2, root / f"sys/fs/cgroup{SVC}", root / "sys/fs/cgroup")
    assert read_oom_count(cgroup) == OomCount(SVC, 2, 2, 0)
    assert host_memory(cgroup, root) == HostMemory(131072000 * 1024, 64 * GIB, SVC)


def test_cgroup_v1_count_and_the_limit_of_a_parent(tmp_path: Path) -> None:
    root = v1_host(tmp_path)
    cgroup = memory_cgroup(root=root)
    assert cgroup == MemoryCgroup(SVC, 1, root / f"sys/fs/cgroup/memory{SVC}", root / "sys/fs/cgroup/memory")
    assert read_oom_count(cgroup) == OomCount(SVC, 1, 1)
    assert host_memory(cgroup, root).cgroup_limit_bytes == 32 * GIB  # the slice's, the leaf has none


def test_hybrid_reads_the_memory_controller_of_v1(tmp_path: Path) -> None:
    root = v1_host(tmp_path, oom_kill=7)
    tree(root, {
        "proc/self/cgroup": V1_LINES + f"0::{SVC}\n",
        "proc/self/mountinfo": OTHER_MOUNTS + V1_MOUNTS
        + "29 24 0:25 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n",
        f"sys/fs/cgroup/unified{SVC}/cgroup.procs": "1\n",   # v2 without the memory controller
    })
    cgroup = memory_cgroup(root=root)
    assert cgroup is not None and cgroup.version == 1
    assert read_oom_count(cgroup) == OomCount(SVC, 1, 7)


def test_a_v1_container_sees_its_own_cgroup_mounted_as_the_root(tmp_path: Path) -> None:
    cg = "/docker/0123abcd"
    root = tree(tmp_path, {
        "proc/self/cgroup": f"12:memory:{cg}\n11:cpu,cpuacct:{cg}\n",
        "proc/self/mountinfo": OTHER_MOUNTS
        + f"30 24 0:26 {cg} /sys/fs/cgroup/memory ro,nosuid master:13 - cgroup cgroup rw,memory\n",
        "proc/meminfo": MEMINFO,
        "sys/fs/cgroup/memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{16 * GIB}\n",
    })
    cgroup = memory_cgroup(root=root)
    assert cgroup == MemoryCgroup(cg, 1, root / "sys/fs/cgroup/memory", root / "sys/fs/cgroup/memory")
    assert read_oom_count(cgroup) == OomCount(cg, 1, 4)
    assert host_memory(cgroup, root).text() == f"host memory: 125.0 GiB, cgroup limit 16.0 GiB (cgroup {cg})"


def test_a_v2_container_in_its_own_cgroup_namespace(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "proc/self/cgroup": "0::/\n",
        "proc/self/mountinfo": OTHER_MOUNTS + V2_MOUNT,
        "proc/meminfo": MEMINFO,
        "sys/fs/cgroup/memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",   # no oom_group_kill (< 5.17)
        "sys/fs/cgroup/memory.max": "max\n",
    })
    cgroup = memory_cgroup(root=root)
    assert read_oom_count(cgroup) == OomCount("/", 2, 0, None)
    assert host_memory(cgroup, root).text() == "host memory: 125.0 GiB, cgroup limit none"


def test_v2_reads_the_nearest_parent_that_accounts_memory(tmp_path: Path) -> None:
    root = v2_host(tmp_path, oom_kill=5)
    (root / f"sys/fs/cgroup{SVC}/memory.events").rename(root / "sys/fs/cgroup/system.slice/memory.events")
    assert read_oom_count(memory_cgroup(root=root)) == OomCount("/system.slice", 2, 5, 0)


def test_the_v2_root_cgroup_has_no_count(tmp_path: Path) -> None:
    root = tree(tmp_path, {"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": OTHER_MOUNTS + V2_MOUNT,
                           "sys/fs/cgroup/cgroup.procs": "1\n"})
    cgroup = memory_cgroup(root=root)
    assert cgroup is not None and read_oom_count(cgroup) is None
    assert host_memory(cgroup, root) == HostMemory(None, None, "/")   # no meminfo in this tree either


@pytest.mark.parametrize("files", [
    {},                                                                   # no /proc at all
    {"proc/self/cgroup": "1:name=systemd:/init.scope\n", "proc/self/mountinfo": OTHER_MOUNTS},
    {"proc/self/cgroup": f"0::{SVC}\n", "proc/self/mountinfo": OTHER_MOUNTS},   # no cgroup2 mounted
    {"proc/self/cgroup": f"0::{SVC}\n", "proc/self/mountinfo": OTHER_MOUNTS + V2_MOUNT},  # not in the tree
    {"proc/self/cgroup": "12:memory:/elsewhere\n",                        # outside the mount's root
     "proc/self/mountinfo": "30 24 0:26 /docker/x /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"},
], ids=["no-proc", "no-memory-controller", "no-cgroup-mount", "no-directory", "outside-the-mount"])
def test_no_cgroup_is_none(tmp_path: Path, files: dict[str, str]) -> None:
    root = tree(tmp_path, {"proc/meminfo": MEMINFO, **files})
    cgroup = memory_cgroup(root=root)
    assert cgroup is None and read_oom_count(cgroup) is None
    assert host_memory(cgroup, root) == HostMemory(131072000 * 1024, None, None)


def test_a_v1_kernel_without_the_oom_kill_field_has_no_count(tmp_path: Path) -> None:
    root = v1_host(tmp_path)
    (root / f"sys/fs/cgroup/memory{SVC}/memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    assert read_oom_count(memory_cgroup(root=root)) is None


def test_a_mount_point_with_a_space_is_unescaped(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        "proc/self/cgroup": "0::/a b\n",
        "proc/self/mountinfo": "35 24 0:30 / /cg\\040root rw - cgroup2 cgroup2 rw\n",
        "cg root/a b/memory.events": "oom_kill 1\n",
    })
    assert read_oom_count(memory_cgroup(root=root)) == OomCount("/a b", 2, 1, None)


def test_the_engine_pid_is_read_by_number(tmp_path: Path) -> None:
    root = v2_host(tmp_path)
    tree(root, {"proc/4242/cgroup": "0::/system.slice\n"})
    cgroup = memory_cgroup(4242, root)
    assert cgroup is not None and cgroup.path == "/system.slice"


@pytest.mark.parametrize("make", [v1_host, v2_host], ids=["v1", "v2"])
def test_before_and_after_an_oom_kill_name_the_oom_killer(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    root = make(tmp_path)
    cgroup = memory_cgroup(root=root)
    before = read_oom_count(cgroup)
    assert before is not None and cgroup is not None
    # the kernel's count moves while the engine loads; kvwatch rereads the same cgroup after the death
    name = "memory.oom_control" if cgroup.version == 1 else "memory.events"
    counter = cgroup.directory / name
    counter.write_text(counter.read_text().replace(f"oom_kill {before.oom_kill}", f"oom_kill {before.oom_kill + 1}"))
    record = kernel_record(before, read_oom_count(cgroup), None)
    assert record.oom_kills == 1
    assert record.where == f"cgroup {SVC}, oom_kill {before.oom_kill}→{before.oom_kill + 1}"
    # another kill -9, the count unchanged: not the OOM killer
    again = read_oom_count(cgroup)
    assert kernel_record(again, read_oom_count(cgroup), None).oom_kills == 0
