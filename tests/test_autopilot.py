"""When kvwatch applies a KV-pressure change by itself, and whether it keeps it (kvwatch.watchdog.autopilot)."""
from __future__ import annotations

import calendar
import time

import pytest

from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.pressure import Window
from kvwatch.watchdog.autopilot import (
    Apply,
    AutopilotConfig,
    Verdict,
    applicable,
    comparable,
    drained,
    in_window,
    may_apply,
    parse_window,
    verdict,
)


def at(hhmm: str) -> float:
    return calendar.timegm(time.strptime(f"2026-12-01 {hhmm}", "%Y-%m-%d %H:%M"))


@pytest.mark.parametrize("window,now,inside", [
    ("02:00-04:00", "02:00", True), ("02:00-04:00", "03:59", True), ("02:00-04:00", "04:00", False),
    ("02:00-04:00", "01:59", False), ("23:00-01:00", "23:30", True), ("23:00-01:00", "00:30", True),
    ("23:00-01:00", "01:00", False), ("23:00-01:00", "12:00", False),
])
def test_the_window(window: str, now: str, inside: bool) -> None:
    assert in_window(window, at(now)) is inside


@pytest.mark.parametrize("text", ["2:00-4:00", "02:00-02:00", "25:00-01:00", "02:00", "", "02:00-04:60"])
def test_a_malformed_window_is_one_error(text: str) -> None:
    with pytest.raises(ValueError, match="HH:MM-HH:MM"):
        parse_window(text)


NOON = at("12:00")
NIGHT = at("02:30")
W = "02:00-04:00"


@pytest.mark.parametrize("config,now,applied,trial,restarting,ok", [
    (AutopilotConfig(), NIGHT, [], False, True, False),                                   # never
    (AutopilotConfig(Apply.AT_RESTART), NOON, [], False, True, True),                     # at a restart
    (AutopilotConfig(Apply.AT_RESTART), NOON, [], False, False, False),                   # not without one
    (AutopilotConfig(Apply.WINDOW, W), NIGHT, [], False, False, True),                    # in the window
    (AutopilotConfig(Apply.WINDOW, W), NOON, [], False, False, False),                    # outside it
    (AutopilotConfig(Apply.WINDOW, W), NOON, [], False, True, True),                      # a restart anyway
    (AutopilotConfig(Apply.WINDOW, W), NIGHT, [NIGHT - 3600], False, False, False),       # the daily bound
    (AutopilotConfig(Apply.WINDOW, W), NIGHT, [NIGHT - 90_000], False, False, True),      # a day later
    (AutopilotConfig(Apply.WINDOW, W, max_changes_per_day=2), NIGHT, [NIGHT - 3600], False, False, True),
    (AutopilotConfig(Apply.WINDOW, W), NIGHT, [], True, False, False),                    # one at a time
])
def test_when_a_change_may_be_applied(config: AutopilotConfig, now: float, applied: list[float], trial: bool,
                                      restarting: bool, ok: bool) -> None:
    assert may_apply(config, now, applied, trial, restarting) is ok


@pytest.mark.parametrize("before,after,result", [
    (Window(600, 60, generated_tokens=60_000), Window(600, 6, generated_tokens=66_000), Verdict.KEEP),
    (Window(600, 60, generated_tokens=60_000), Window(600, 60, generated_tokens=60_000), Verdict.ROLL_BACK),
    (Window(600, 60, generated_tokens=60_000), Window(600, 6, generated_tokens=30_000), Verdict.ROLL_BACK),
    (Window(600, 0, waiting=5), Window(600, 0, waiting=0.5), Verdict.KEEP),           # the queue, not preemptions
    (Window(600, 60), Window(600, 30), Verdict.KEEP),                                  # no throughput series
])
def test_kept_or_rolled_back(before: Window, after: Window, result: Verdict) -> None:
    assert verdict(before, after) is result


@pytest.mark.parametrize("running,waiting,waited,timeout,done", [
    (0, 0, 1, 120, True), (2, 0, 1, 120, False), (0, 3, 1, 120, False), (2, 1, 120, 120, True),
    (None, None, 5, 120, False), (None, None, 120, 120, True), (0, None, 0, 0, True), (5, 5, 0, 0, True),
])
def test_the_drain(running: float | None, waiting: float | None, waited: float, timeout: float, done: bool) -> None:
    assert drained(running, waiting, waited, timeout) is done


FP8 = FlagChange({"--kv-cache-dtype": "fp8"})


@pytest.mark.parametrize("fixed,rolled_back,ok", [
    ((), (), True), (("--block-size",), (), True), (("--kv-cache-dtype",), (), False),
    ((), (FP8,), False), ((), (FlagChange({"--max-num-seqs": "4"}),), True),
])
def test_what_the_autopilot_may_apply(fixed: tuple[str, ...], rolled_back: tuple[FlagChange, ...], ok: bool) -> None:
    assert applicable(FP8, fixed, rolled_back) is ok


@pytest.mark.parametrize("before,ok", [(None, False), (Window(10, 5), False), (Window(24, 5), True), (Window(30, 5), True)])
def test_a_change_is_compared_with_a_whole_window(before: Window | None, ok: bool) -> None:
    assert comparable(before, 30.0) is ok
