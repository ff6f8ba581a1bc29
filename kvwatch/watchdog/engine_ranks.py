"""Which data-parallel engine core died first (pure: process listings in, ranks out).

With --data-parallel-size N the API server runs N engine cores, each titled
`VLLM::EngineCore_DP<rank>` (vLLM sets the process title; its log prefix is
`(EngineCore_DP<rank> pid=N)`). A core killed outright (kill -9, the OOM killer) writes
nothing, and the API server then stops the other cores: the log names no culprit. The
watchdog looks at the engine's process tree every tick; a rank whose core is gone while
another rank's still runs is the one that died.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_CORE = re.compile(r"EngineCore_DP(\d+)\b")
# The processes that compute: vLLM titles them `<prefix>::EngineCore[_DP<rank>]` and
# `<prefix>::Worker[_<name>]` (vLLM 0.32.0, vllm/v1/engine/core.py:1411 and
# vllm/v1/executor/multiproc_executor.py:1074; the prefix is VLLM_PROCESS_NAME_PREFIX, "VLLM" by
# default, vllm/utils/system_utils.py:180). A title read from /proc/PID/comm is cut at 15 characters.
_COMPUTES = re.compile(r"::(?:EngineCor|Worker)")


def computes(title: str) -> bool:
    """Whether a process of the engine's tree is an engine core or a worker, from its title."""
    return _COMPUTES.search(title) is not None


def rank_of(title: str) -> int | None:
    """The DP rank of an engine core process, from its title or command line."""
    m = _CORE.search(title)
    return int(m[1]) if m else None


@dataclass
class RankWatch:
    """The engine cores seen so far; `lost` holds the ranks that died while another lived."""

    cores: dict[int, int] = field(default_factory=dict)      # rank -> pid of its live core
    lost: dict[int, int] = field(default_factory=dict)       # rank -> pid, in the order they died

    def update(self, processes: Iterable[tuple[int, str]]) -> list[int]:
        """(pid, title) of the tree's live processes; returns the ranks newly found dead."""
        live = {}
        for pid, title in processes:
            rank = rank_of(title)
            if rank is not None:
                live[rank] = pid
        gone = [r for r, pid in self.cores.items() if live.get(r) != pid]
        newly = []
        if gone and len(gone) < len(self.cores):     # some cores still run: these died first
            for rank in sorted(gone):
                if rank not in self.lost:
                    self.lost[rank] = self.cores[rank]
                    newly.append(rank)
        self.cores = live
        return newly


def lines_of_rank(lines: list[str], rank: int) -> list[str]:
    """The engine's lines without those another DP rank's core printed: what to diagnose a rank's death by."""
    out = []
    for line in lines:
        m = _CORE.search(line[:200])
        if m is None or int(m[1]) == rank:
            out.append(line)
    return out


def ranks_of_tree(processes: Iterable[tuple[int, int, str]]) -> dict[int, int]:
    """pid -> DP rank for an engine core and its descendants (workers); (pid, ppid, title) in.
    Processes under no core (the API server, the DP coordinator) are left out."""
    parent: dict[int, int] = {}
    own: dict[int, int] = {}
    for pid, ppid, title in processes:
        parent[pid] = ppid
        rank = rank_of(title)
        if rank is not None:
            own[pid] = rank
    out: dict[int, int] = {}
    for pid in parent:
        seen, at = 0, pid
        while at in parent and at not in own and seen < 64:   # bounded: a tree is never that deep
            at, seen = parent[at], seen + 1
        if at in own:
            out[pid] = own[at]
    return out
