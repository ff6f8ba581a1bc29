"""Before a stall restart: the engine's stacks and where they say it is stuck (driver: the collector is
boundary/stack_dump.py, the reading of the stacks diagnosis/stall_stacks.py)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.boundary.stack_dump import StackText, collect, vllm_dump_dir
from kvwatch.diagnosis.stall_stacks import StuckAt, parse_stacks, where_stuck
from kvwatch.planner.engine_args import EngineCommand

MAX_EVIDENCE_CHARS = 64 * 1024   # what a failure record keeps of the stacks (the state file stays small)


@dataclass(frozen=True)
class StallEvidence:
    stacks: tuple[StackText, ...]
    stuck: StuckAt | None        # None: no stack could be read

    def summary(self) -> str:
        """One line for the log and the failure's reason."""
        if self.stuck is not None:
            return f"stuck at {self.stuck.describe()}"
        errors = "; ".join(f"{s.process}: {s.error}" for s in self.stacks if s.error) or "no engine process"
        return f"no stacks: {errors}"

    def text(self, limit: int = MAX_EVIDENCE_CHARS) -> str:
        """The stacks as read, each under its process's name, cut at `limit` characters."""
        parts = [f"== {s.process} ({s.source}) ==\n{s.text or s.error or ''}".rstrip() for s in self.stacks]
        joined = "\n\n".join(parts)
        return joined if len(joined) <= limit else joined[:limit] + "\n[... cut]"


def stall_evidence(pids: Sequence[int], command: EngineCommand, timeout: float = 10.0,
                   newer_than: float | None = None, py_spy: str | None = None) -> StallEvidence:
    """Before a stall restart: the engine's stacks (collect(), with the command's vLLM dump dir) and
    where they say it is stuck (diagnosis/stall_stacks.where_stuck). Never raises; at most `timeout`."""
    stacks = collect(pids, timeout, vllm_dump_dir(command), newer_than, py_spy)
    threads = [t for s in stacks if s.text for t in parse_stacks(s.text, s.process)]
    return StallEvidence(tuple(stacks), where_stuck(threads))
