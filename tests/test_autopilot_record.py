"""What the state file keeps of the autopilot (kvwatch/watchdog/autopilot_record.py), as tables."""
from __future__ import annotations

from typing import Any

import pytest

from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.pressure import Window
from kvwatch.watchdog import autopilot_record
from kvwatch.watchdog.autopilot import Trial, Verdict
from kvwatch.watchdog.autopilot_record import MAX_ROLLED_BACK, ON_TRIAL
from kvwatch.watchdog.memory_learning import MAX_LEARNED_PROFILES

SEQS = FlagChange({"--max-num-seqs": 4})
LEN = FlagChange({"--max-model-len": 2048})
BEFORE = Window(600.0, 12.0, generated_tokens=18_000.0)
AFTER = Window(600.0, 0.0, generated_tokens=17_000.0)
TRIAL = Trial(SEQS, 1_700_000_000.0, None, BEFORE, ("vllm", "serve", "m"), "p1", "preempting")


@pytest.mark.parametrize("name,rolled,profile,expected", [
    ("none rolled back", {}, "p1", []),
    ("this profile's", {"p1": [SEQS.to_json()], "p2": [LEN.to_json()]}, "p1", [SEQS]),
    ("an entry that is no change is skipped", {"p1": ["junk", SEQS.to_json(), {"set": 3}]}, "p1", [SEQS]),
])
def test_rolled_back(name: str, rolled: dict[str, list[Any]], profile: str, expected: list[FlagChange]) -> None:
    assert autopilot_record.rolled_back(rolled, profile) == expected


@pytest.mark.parametrize("changes,expected", [
    ([], []),
    ([{"at": 1}, {"at": 2.5}], [1.0, 2.5]),
    ([{"at": "x"}, "junk", {"change": {}}, {"at": 3}], [3.0]),
])
def test_applied_times(changes: list[Any], expected: list[float]) -> None:
    assert autopilot_record.applied_times(changes) == expected


def test_a_change_put_on_trial_is_opened() -> None:
    entry = autopilot_record.opened(TRIAL, "window")
    assert entry["result"] == ON_TRIAL and entry["when"] == "window" and entry["after"] is None
    assert entry["change"] == SEQS.to_json() and entry["profile"] == "p1" and entry["at"] == TRIAL.applied_at


@pytest.mark.parametrize("name,last,result,after,replaces,outcome", [
    ("kept: its own entry closed", autopilot_record.opened(TRIAL, "window"), Verdict.KEEP, AFTER, True, "kept"),
    ("rolled back after a failure", autopilot_record.opened(TRIAL, "at_restart"), Verdict.ROLL_BACK, None, True,
     "rolled_back"),
    ("resumed: no entry left", None, Verdict.KEEP, AFTER, False, "kept"),
    ("the last entry is another change's", {**autopilot_record.opened(TRIAL, "window"), "change": LEN.to_json()},
     Verdict.ROLL_BACK, AFTER, False, "rolled_back"),
    ("the last entry is closed already", {**autopilot_record.opened(TRIAL, "window"), "result": "kept"},
     Verdict.KEEP, AFTER, False, "kept"),
])
def test_a_trial_is_closed(name: str, last: dict[str, Any] | None, result: Verdict, after: Window | None,
                           replaces: bool, outcome: str) -> None:
    entry, same = autopilot_record.closed(last, TRIAL, result, after, "detail")
    assert same is replaces
    assert entry["result"] == outcome and entry["detail"] == "detail"
    assert (entry["after"] is None) is (after is None)
    assert entry["change"] == SEQS.to_json()
    if replaces:
        assert last is not None and entry["when"] == last["when"] and list(entry)[: len(last)] == list(last)


def test_rolled_back_changes_are_bounded_per_profile_and_in_profiles() -> None:
    rolled: dict[str, list[Any]] = {}
    for _ in range(MAX_ROLLED_BACK + 3):
        rolled = autopilot_record.with_rolled_back(rolled, "p1", SEQS)
    assert len(rolled["p1"]) == MAX_ROLLED_BACK
    for i in range(MAX_LEARNED_PROFILES + 2):
        rolled = autopilot_record.with_rolled_back(rolled, f"q{i}", LEN)
    assert len(rolled) == MAX_LEARNED_PROFILES and "p1" not in rolled and f"q{MAX_LEARNED_PROFILES + 1}" in rolled


def test_with_rolled_back_leaves_its_argument_alone() -> None:
    rolled: dict[str, list[Any]] = {"p1": [LEN.to_json()]}
    out = autopilot_record.with_rolled_back(rolled, "p1", SEQS)
    assert rolled == {"p1": [LEN.to_json()]} and out == {"p1": [LEN.to_json(), SEQS.to_json()]}
