"""What the state file an earlier kvwatch left means for this start (pure).

Which command is launched is next_command.py's (`AtStart`); here: a stop for host memory that no
failure followed (the host wedged or rebooted first) and the diagnosis it stands for, and the rule
table with the block sizes this host's engine reported. startup.py acts on the answers.
"""
from __future__ import annotations

from collections.abc import Sequence

from kvwatch.diagnosis import Diagnosis
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.rules import RuleSet, with_learned_block_sizes
from kvwatch.watchdog.records import Constraint, FailureRecord, HostMemoryStop

STOPPED_FOR_HOST_MEMORY = "stopped for host memory"


def unfollowed_stop(stops: Sequence[HostMemoryStop], failures: Sequence[FailureRecord]) -> HostMemoryStop | None:
    """The last stop for host memory, when no failure was recorded at or after it."""
    stop = stops[-1] if stops else None
    if stop is None or any(f.time >= stop.time for f in failures):
        return None
    return stop


def stop_failure(stop: HostMemoryStop, said: str) -> FailureRecord:
    """The stop counted as the host OOM it was (`said`: host_memory_watch.describe_stop's words)."""
    return FailureRecord(FailureKind.HOST_OOM, said, stop.time, list(stop.argv), STOPPED_FOR_HOST_MEMORY, stop.phase)


def stop_diagnosis(stop: HostMemoryStop, said: str) -> Diagnosis:
    """The stop as recovery.decide reads a host OOM: once in its phase already, so the next start
    re-plans with less host memory rather than repeat it."""
    return Diagnosis(FailureKind.HOST_OOM, said, {"phase": stop.phase, "repeats": 1}, fatal=False)


def learned_rules(rules: RuleSet, constraints: Sequence[Constraint]) -> RuleSet:
    """The rule table, with the block sizes earlier failures on this host reported."""
    learned: dict[str, list[object]] = {}
    for constraint in constraints:
        learned.update(constraint.backend_block_sizes)
    return with_learned_block_sizes(rules, learned) if learned else rules
