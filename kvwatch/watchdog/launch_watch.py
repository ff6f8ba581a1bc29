"""The watch of one launch as a pure step per tick: from what the supervisor's loop saw (a stop
request, the engine's exit code, a health probe's answer, the time), the next state and what happens.

    STARTING: probe every tick; a good probe -> READY; past start_timeout -> START_TIMEOUT
    READY:    probe every health interval; stable_seconds of good probes -> STABLE (backoff reset);
              a failed probe after the engine logged its death -> EXIT (served); failed probes for
              hang_timeout -> HANG; good probes while requests run and no token comes for
              stall_timeout -> STALLED (served; progress.py reads the counters)
    any:      a stop request -> STOP; the engine's exit -> EXIT (served when it had been READY)

Nothing here waits, probes or spawns: the supervisor does, and acts on the answer
(tests/test_launch_watch.py holds every row).
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvwatch.watchdog.outcomes import LaunchOutcome
from kvwatch.watchdog.progress import Reading, Watch, observe


@dataclass(frozen=True)
class LaunchEnd:
    """How one launch ended."""

    outcome: LaunchOutcome
    detail: str = ""
    returncode: int | None = None
    served: bool = False        # it had been READY (the diagnosis reads a serving engine's death apart)
    stacks: str = ""            # a stalled engine's thread stacks, read before it was stopped


@dataclass(frozen=True)
class Timing:
    """The watch's clocks, from the config (engine.*_seconds, policy.stable_seconds)."""

    health_interval: float
    start_timeout: float
    hang_timeout: float
    stable_after: float
    stall_timeout: float = 0.0    # 0: no stall detection

    @property
    def tick(self) -> float:
        """How often the loop looks: every second at most, faster with a faster health interval."""
        return min(1.0, self.health_interval)

    @property
    def probe_timeout(self) -> float:
        return max(1.0, min(5.0, self.health_interval))


@dataclass(frozen=True)
class LaunchState:
    """What the watch knows of the running launch (monotonic seconds)."""

    started: float
    next_probe: float
    last_ok: float
    ready_since: float | None = None
    ready_line: int = 0          # the engine's output lines seen when it became READY
    stable: bool = False
    progress: Watch = Watch()    # the stall detector's memory (READY only)

    @classmethod
    def at_launch(cls, now: float) -> LaunchState:
        return cls(started=now, next_probe=now, last_ok=now)

    @property
    def ready(self) -> bool:
        return self.ready_since is not None


class Event(enum.Enum):
    NONE = "none"
    READY = "ready"       # the first good probe: STARTING -> READY
    STABLE = "stable"     # READY for stable_after: the backoff starts over


def before_probe(state: LaunchState, stop_requested: bool, returncode: int | None) -> LaunchEnd | None:
    """At the top of each tick: a stop request, then the engine's exit, end the launch."""
    if stop_requested:
        return LaunchEnd(LaunchOutcome.STOP)
    if returncode is not None:
        return LaunchEnd(LaunchOutcome.EXIT, f"exited with code {returncode}", returncode, served=state.ready)
    return None


def probe_due(state: LaunchState, now: float) -> bool:
    return now >= state.next_probe


def after_probe(state: LaunchState, ok: bool, now: float, timing: Timing, lines_seen: int,
                died_in_log: Callable[[int], str | None],
                reading: Reading | None = None) -> tuple[LaunchState, Event, LaunchEnd | None]:
    """One probe's answer at `now`: the next state, the event, and the end of the launch if it ended.
    `died_in_log(since_line)` says whether the engine logged its death since READY (asked only when a
    probe of a READY engine failed: it diagnoses the output). `reading`: the engine's counters read
    with a good probe of a READY engine, for the stall detector (None: not read)."""
    if not state.ready:
        # While starting, look every tick: a refused connection costs nothing, and READY (and the
        # exporter's view of it) should not lag by a whole health interval.
        state = replace(state, next_probe=now + timing.tick)
        if ok:   # the next probe a tick later still: the first after READY comes soon
            return replace(state, ready_since=now, last_ok=now, ready_line=lines_seen), Event.READY, None
        if now - state.started > timing.start_timeout:
            return state, Event.NONE, LaunchEnd(LaunchOutcome.START_TIMEOUT,
                                                f"not ready after {timing.start_timeout:.0f}s")
        return state, Event.NONE, None
    state = replace(state, next_probe=now + timing.health_interval)
    if ok:
        state = replace(state, last_ok=now)
        ready_since = state.ready_since
        assert ready_since is not None
        if reading is not None and timing.stall_timeout > 0:
            progress, stall = observe(state.progress, reading, timing.stall_timeout)
            state = replace(state, progress=progress)
            if stall is not None:
                return state, Event.NONE, LaunchEnd(LaunchOutcome.STALLED, stall.evidence, served=True)
        if not state.stable and now - ready_since >= timing.stable_after:
            return replace(state, stable=True), Event.STABLE, None
        return state, Event.NONE, None
    if (died := died_in_log(state.ready_line)) is not None:
        return state, Event.NONE, LaunchEnd(LaunchOutcome.EXIT, died, served=True)  # no need to wait out the hang
    if now - state.last_ok > timing.hang_timeout:
        return state, Event.NONE, LaunchEnd(LaunchOutcome.HANG, f"/health failed or timed out for "
                                            f"{now - state.last_ok:.0f}s (hang_timeout {timing.hang_timeout:.0f}s)",
                                            served=True)
    return state, Event.NONE, None


def died_in_log(lines: list[str]) -> str | None:
    """/health failed: did the engine say, since READY, that it died (EngineCore gone, ...)?"""
    if not lines:
        return None
    from kvwatch.diagnosis import FailureKind, diagnose  # here: the diagnosis is loaded only when asked

    diagnosis = diagnose(lines)
    if diagnosis.kind == FailureKind.UNKNOWN:
        return None
    return f"/health failed after the engine logged: {diagnosis.evidence or diagnosis.kind}"
