"""The processes of the running engine, as the supervisor last saw them: every process seen (dead
ones too, so a stop reaches those that left the group), the live pids, and the data-parallel ranks."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvwatch.boundary.proc_inspect import ProcInfo, ProcRef
from kvwatch.watchdog.engine_ranks import RankWatch, computes, ranks_of_tree


@dataclass
class EngineTree:
    refs: list[ProcRef] = field(default_factory=list)      # every process seen in the tree, dead ones too
    live: frozenset[int] = frozenset()                     # the pids of the last look
    ranks: RankWatch = field(default_factory=RankWatch)    # data-parallel engine cores, and which died
    pid_ranks: dict[int, int] = field(default_factory=dict)  # pid -> DP rank of the core it belongs to
    compute: frozenset[int] = frozenset()                  # the live engine cores and workers (by title)

    def update(self, infos: Sequence[ProcInfo], force: bool = False) -> tuple[list[int], bool]:
        """Take one look: the DP ranks whose engine core is newly gone, and whether the pids changed
        (always True when `force`d: the first look of a launch)."""
        lost = list(self.ranks.update((p.pid, " ".join(p.cmdline) or p.name) for p in infos))
        live = frozenset(p.pid for p in infos)
        if not force and live == self.live:
            return lost, False
        self.live = live
        self.compute = frozenset(p.pid for p in infos if computes(p.name) or computes(" ".join(p.cmdline[:1])))
        self.pid_ranks = ranks_of_tree((p.pid, p.ppid, " ".join(p.cmdline) or p.name) for p in infos)
        known = {r.pid: r for r in self.refs}
        known.update({p.pid: ProcRef(p.pid, p.create_time) for p in infos})
        self.refs = list(known.values())
        return lost, True
