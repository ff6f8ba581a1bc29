"""Before a launch: end what is left of our earlier engines; report, never touch, anyone else's.

"Ours" is proven, not guessed: a pid recorded in the state file whose start time still
matches (a reused pid has another), or a process carrying the marker variable kvwatch
puts into every engine's environment (inherited by EngineCore and the Workers).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvwatch.boundary import proc_inspect, spawn
from kvwatch.boundary.proc_inspect import ProcRef

_LOG = logging.getLogger(__name__)

MARKER_ENV = "KVWATCH_ENGINE"


def marker(state_dir: str, name: str) -> str:
    return f"{name}@{os.path.abspath(state_dir)}"


@dataclass
class CleanupReport:
    stopped: list[int] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)   # "pid 123 (python, user x) holds port 8000"


def is_ours(pid: int, mark: str) -> bool:
    """Provably ours: it carries our engine's marker (a recorded pid alone proves nothing: the
    state file may be edited by anyone who can write it)."""
    return proc_inspect.environ_value(pid, MARKER_ENV) == mark


def clean(refs: list[ProcRef], mark: str, port: int | None, gpu_holders: Callable[[], Iterable[tuple[str, int]]],
          timeout: float, sleep: Callable[[float], None] = time.sleep) -> CleanupReport:
    """Stop recorded processes still alive; then look at who holds the engine's port and GPUs
    (asked only after that, so what was just stopped is not reported)."""
    report = CleanupReport()
    # Recorded pids whose start time matches AND that carry our marker: the state file alone is
    # no proof (a hand-edited one could name anyone's process).
    ours = [r for r in refs if proc_inspect.alive(r) is not None and is_ours(r.pid, mark)]
    for ref in refs:
        if ref not in ours and proc_inspect.alive(ref) is not None:
            report.foreign.append(f"{proc_inspect.describe(ref.pid)} is recorded as ours but carries no marker")
    report.stopped = spawn.kill_processes(ours, timeout, sleep, marker=(MARKER_ENV, mark))
    if report.stopped:
        _LOG.warning("leftovers: stopped our earlier engine processes %s", report.stopped)
    holders: list[tuple[str, int | None]] = []
    if port is not None:
        holders += [(f"port {port}", pid) for pid in proc_inspect.listening_on(port)]
    holders += [(f"GPU {gpu}", pid) for gpu, pid in gpu_holders()]
    me = os.getpid()
    for what, pid in holders:
        if pid is None:
            report.foreign.append(f"a process kvwatch cannot see holds {what}")
            continue
        if pid == me:
            continue
        if not proc_inspect.running(pid):
            continue  # gone already (NVML may list a process for a moment after it exits)
        held = proc_inspect.ref_of(pid)
        if held is not None and is_ours(pid, mark):
            stopped = spawn.kill_processes([held], timeout, sleep, marker=(MARKER_ENV, mark))
            report.stopped += stopped
            _LOG.warning("leftovers: stopped our pid %d holding %s", pid, what)
        else:
            report.foreign.append(f"{proc_inspect.describe(pid)} holds {what}")
    for line in report.foreign:
        _LOG.warning("foreign: %s; not ours, left alone", line)
    return report
