"""The watch of one launch, a pure step per tick (kvwatch/watchdog/launch_watch.py), as tables."""
from __future__ import annotations

import pytest

from kvwatch.watchdog.launch_watch import (
    Event,
    LaunchEnd,
    LaunchState,
    Timing,
    after_probe,
    before_probe,
    probe_due,
)
from kvwatch.watchdog.outcomes import LaunchOutcome

T = Timing(health_interval=5.0, start_timeout=60.0, hang_timeout=20.0, stable_after=300.0)
START = LaunchState.at_launch(0.0)
READY = LaunchState(started=0.0, next_probe=40.0, last_ok=35.0, ready_since=30.0, ready_line=7)


def never_died(since: int) -> str | None:
    return None


@pytest.mark.parametrize("state,stop,rc,end", [
    (START, False, None, None),
    (START, True, None, LaunchEnd(LaunchOutcome.STOP)),
    (START, True, 1, LaunchEnd(LaunchOutcome.STOP)),                      # the stop request first
    (START, False, 1, LaunchEnd(LaunchOutcome.EXIT, "exited with code 1", 1, served=False)),
    (READY, False, -9, LaunchEnd(LaunchOutcome.EXIT, "exited with code -9", -9, served=True)),
])
def test_before_each_probe_a_stop_then_an_exit_ends_the_launch(state: LaunchState, stop: bool, rc: int | None,
                                                               end: LaunchEnd | None) -> None:
    assert before_probe(state, stop, rc) == end


# name, state, probe answer, now, died in the log, next state's fields, event, outcome of the end
ROWS = [
    ("starting, refused: look again next tick", START, False, 3.0, None,
     {"next_probe": 4.0, "ready_since": None}, Event.NONE, None),
    ("starting, answered: READY, next look a tick later", START, True, 3.0, None,
     {"ready_since": 3.0, "last_ok": 3.0, "ready_line": 12, "next_probe": 4.0}, Event.READY, None),
    ("starting past the start timeout", START, False, 61.0, None, {}, Event.NONE, LaunchOutcome.START_TIMEOUT),
    ("starting at the start timeout: not yet", START, False, 60.0, None, {}, Event.NONE, None),
    ("ready, answered: next look a health interval later", READY, True, 40.0, None,
     {"last_ok": 40.0, "next_probe": 45.0, "stable": False}, Event.NONE, None),
    ("ready for stable_after: STABLE", READY, True, 330.0, None, {"stable": True}, Event.STABLE, None),
    ("stable already: no second STABLE", LaunchState(0.0, 400.0, 395.0, 30.0, 7, stable=True), True, 400.0, None,
     {"stable": True}, Event.NONE, None),
    ("ready, no answer, within the hang timeout", READY, False, 54.0, None, {"last_ok": 35.0}, Event.NONE, None),
    ("ready, no answer past the hang timeout: HANG", READY, False, 56.0, None, {}, Event.NONE, LaunchOutcome.HANG),
    ("ready, no answer, and the engine logged its death: EXIT at once", READY, False, 40.0, "EngineCore died", {},
     Event.NONE, LaunchOutcome.EXIT),
]


@pytest.mark.parametrize("name,state,ok,now,died,fields,event,outcome", ROWS, ids=[r[0] for r in ROWS])
def test_after_each_probe(name: str, state: LaunchState, ok: bool, now: float, died: str | None, fields: dict,
                          event: Event, outcome: LaunchOutcome | None) -> None:
    asked: list[int] = []

    def died_in_log(since: int) -> str | None:
        asked.append(since)
        return died

    new, got_event, end = after_probe(state, ok, now, T, 12, died_in_log)
    assert {k: getattr(new, k) for k in fields} == fields
    assert got_event is event
    assert (end.outcome if end else None) is outcome
    if end is not None and end.outcome is not LaunchOutcome.START_TIMEOUT:
        assert end.served
    # The log is diagnosed only when a READY engine failed a probe, and from the line it became READY on.
    assert asked == ([7] if state.ready and not ok else [])


def test_the_ends_say_why() -> None:
    _, _, hang = after_probe(READY, False, 56.0, T, 12, never_died)
    assert hang == LaunchEnd(LaunchOutcome.HANG, "/health failed or timed out for 21s (hang_timeout 20s)", served=True)
    _, _, late = after_probe(START, False, 61.0, T, 0, never_died)
    assert late == LaunchEnd(LaunchOutcome.START_TIMEOUT, "not ready after 60s")
    _, _, died = after_probe(READY, False, 40.0, T, 12, lambda since: "/health failed after the engine logged: x")
    assert died == LaunchEnd(LaunchOutcome.EXIT, "/health failed after the engine logged: x", served=True)


@pytest.mark.parametrize("health,tick,probe_timeout", [(5.0, 1.0, 5.0), (0.2, 0.2, 1.0), (30.0, 1.0, 5.0)])
def test_the_tick_and_the_probe_timeout_follow_the_health_interval(health: float, tick: float,
                                                                   probe_timeout: float) -> None:
    timing = Timing(health, 60.0, 20.0, 300.0)
    assert (timing.tick, timing.probe_timeout) == (tick, probe_timeout)


def test_a_probe_is_due_from_its_time_on() -> None:
    assert probe_due(START, 0.0) and not probe_due(READY, 39.9) and probe_due(READY, 40.0)


# -- stalls: good probes, requests running, no token (progress.py reads the counters) ----------------

STALLING = Timing(health_interval=5.0, start_timeout=60.0, hang_timeout=20.0, stable_after=300.0, stall_timeout=30.0)


def _serve(timing: Timing, readings: list) -> tuple[LaunchState, list[LaunchEnd | None]]:
    state, ends = READY, []
    for i, reading in enumerate(readings):
        state, _, end = after_probe(state, True, 40.0 + 5 * i, timing, 12, never_died, reading)
        ends.append(end)
    return state, ends


def test_a_stall_ends_the_launch_as_stalled_with_the_counters_as_evidence() -> None:
    from kvwatch.watchdog.progress import Reading
    readings = [Reading(40.0 + 5 * i, 1, 100, 50) for i in range(8)]
    _, ends = _serve(STALLING, readings)
    first = next(i for i, e in enumerate(ends) if e is not None)
    assert first == 6   # the window opened at 40 s; 30 s later
    end = ends[first]
    assert end is not None and end.outcome is LaunchOutcome.STALLED and end.served
    assert "1 requests running and no token for 30s" in end.detail and "/health still answers" in end.detail


@pytest.mark.parametrize("name,timing,readings", [
    ("tokens come", STALLING, "moving"),
    ("the detector is off (stall_timeout 0)", T, "still"),
    ("no counters read (the engine's /metrics gave none)", STALLING, "none"),
])
def test_no_stall(name: str, timing: Timing, readings: str) -> None:
    from kvwatch.watchdog.progress import Reading
    rows = {"moving": [Reading(40.0 + 5 * i, 1, 100, 50 + i) for i in range(20)],
            "still": [Reading(40.0 + 5 * i, 1, 100, 50) for i in range(20)],
            "none": [None] * 20}[readings]
    _, ends = _serve(timing, rows)
    assert ends == [None] * 20, name
