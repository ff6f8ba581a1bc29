"""Transitional: the names kvwatch/watchdog/supervisor.py (and its tests) still reach as ``processes.X``.

The process boundary is two modules now: kvwatch/boundary/spawn.py starts and stops the engine,
kvwatch/boundary/proc_inspect.py reads processes (the only importer of psutil). Nothing else may
import this module (tests/test_import_contract.py); it goes once the supervisor imports those two.
"""
from __future__ import annotations

from kvwatch.boundary.proc_inspect import (
    ProcInfo,
    ProcRef,
    alive,
    describe,
    environ_value,
    group_members,
    is_same,
    listening_on,
    marked,
    name_of,
    reap_orphans,
    ref_of,
    rss,
    running,
    tree,
)
from kvwatch.boundary.spawn import EngineProcess, kill_processes, spawn, stop_group

__all__ = ["EngineProcess", "ProcInfo", "ProcRef", "alive", "describe", "environ_value", "group_members", "is_same",
           "kill_processes", "listening_on", "marked", "name_of", "reap_orphans", "ref_of", "rss", "running", "spawn",
           "stop_group", "tree"]
