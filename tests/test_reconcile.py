"""What the state file an earlier kvwatch left means for this start (kvwatch/watchdog/reconcile.py)."""
from __future__ import annotations

import pytest

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.rules import ruleset_for
from kvwatch.watchdog import reconcile
from kvwatch.watchdog.records import Constraint, FailureRecord, HostMemoryStop

ARGV = ["vllm", "serve", "m"]
STOP = HostMemoryStop(1000.0, "loading weights", "MemAvailable 2% of MemTotal", ARGV)


def failure(at: float) -> FailureRecord:
    return FailureRecord(FailureKind.ENGINE_DIED, "died", at, ARGV)


@pytest.mark.parametrize("name,stops,failures,expected", [
    ("no stop", [], [failure(900.0)], None),
    ("a stop no failure followed", [STOP], [failure(900.0)], STOP),
    ("a stop a failure followed", [STOP], [failure(1001.0)], None),
    ("a stop counted as a failure at its own time", [STOP], [failure(1000.0)], None),
    ("the last stop is the one", [HostMemoryStop(10.0, "serving", "x", ARGV), STOP], [failure(500.0)], STOP),
])
def test_unfollowed_stop(name: str, stops: list[HostMemoryStop], failures: list[FailureRecord],
                         expected: HostMemoryStop | None) -> None:
    assert reconcile.unfollowed_stop(stops, failures) == expected


def test_a_stop_counts_as_the_host_oom_it_was() -> None:
    record = reconcile.stop_failure(STOP, "said")
    assert (record.kind, record.evidence, record.time, record.argv, record.phase) == (
        FailureKind.HOST_OOM, "said", 1000.0, ARGV, "loading weights")
    diagnosis = reconcile.stop_diagnosis(STOP, "said")
    assert diagnosis.kind == FailureKind.HOST_OOM and not diagnosis.fatal
    assert diagnosis.facts == {"phase": "loading weights", "repeats": 1}


def test_learned_rules_take_the_block_sizes_the_engine_reported() -> None:
    rules = ruleset_for("0.32.0")
    assert reconcile.learned_rules(rules, []) is rules
    assert reconcile.learned_rules(rules, [Constraint(FailureKind.UNKNOWN, "x")]) is rules
    name = rules.backends[0].name
    learned = reconcile.learned_rules(rules, [Constraint(FailureKind.UNKNOWN, "x", backend_block_sizes={name: [64]})])
    assert learned.backends[0].block_sizes == (64,) and learned.backends[1:] == rules.backends[1:]
