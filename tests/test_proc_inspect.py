"""proc_inspect's per-tick reads (cpu_seconds, rss) read /proc themselves: the figures psutil gives."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from kvwatch.boundary import proc_inspect

GONE = 4_000_000   # above any pid_max: no such process


def _psutil_cpu(pids: list[int]) -> float | None:
    total, seen = 0.0, False
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total, seen = total + times.user + times.system, True
    return total if seen else None


def test_cpu_seconds_and_rss_are_psutils_for_running_zombie_and_gone_processes() -> None:
    # a child that used 0.2 s of CPU and then sleeps (its figures stay put while they are compared)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.2: pass\n"
                             "print('done', flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE, text=True)
    zombie = subprocess.Popen(["true"])
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "done\n"
        deadline = time.monotonic() + 5
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = [os.getpid(), busy.pid, zombie.pid, GONE]
        assert proc_inspect.cpu_seconds([busy.pid, zombie.pid, GONE]) == _psutil_cpu([busy.pid, zombie.pid, GONE])
        assert proc_inspect.cpu_seconds([busy.pid]) >= 0.2 - 0.011   # to the clock tick
        assert proc_inspect.cpu_seconds([GONE]) is None
        assert proc_inspect.cpu_seconds([]) is None
        rss = proc_inspect.rss(pids)
        assert set(rss) == {os.getpid(), busy.pid, zombie.pid}
        assert rss[busy.pid] == psutil.Process(busy.pid).memory_info().rss
        assert rss[zombie.pid] == 0
        assert abs(rss[os.getpid()] - psutil.Process().memory_info().rss) < 4 << 20   # ours moves a little
    finally:
        busy.kill()
        busy.wait()
        zombie.wait()
