"""The one way kvwatch ends processes (kvwatch.boundary.escalation): SIGTERM and SIGCONT, a grace
period, SIGKILL. Used by spawn.stop_group, spawn.stop_each and the reaper."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable

from kvwatch.boundary.escalation import escalate


class World:
    """Processes that leave after given signals, on a fake clock."""

    def __init__(self, leaves_on: set[int] | None = None, alive: bool = True) -> None:
        self.now = 0.0
        self.sent: list[tuple[float, str]] = []
        self.alive = alive
        self.leaves_on = leaves_on or set()

    def send(self, sig: int) -> None:
        self.sent.append((self.now, signal.Signals(sig).name))
        if sig in self.leaves_on:
            self.alive = False

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def run(self, grace: float = 5.0, kill_wait: float = 10.0,
            before_kill: Callable[[], None] | None = None) -> bool:
        return escalate(self.send, lambda: self.alive, grace, kill_wait=kill_wait, clock=lambda: self.now,
                        sleep=self.sleep, before_kill=before_kill)


def test_nothing_left_sends_nothing() -> None:
    world = World(alive=False)
    assert world.run() is True and world.sent == []


def test_sigterm_and_sigcont_are_enough_for_a_process_that_obeys() -> None:
    world = World(leaves_on={signal.SIGTERM})
    assert world.run() is True
    assert world.sent == [(0.0, "SIGTERM"), (0.0, "SIGCONT")]


def test_sigkill_after_the_grace_period() -> None:
    world = World(leaves_on={signal.SIGKILL})
    logged: list[float] = []
    assert world.run(grace=2.0, before_kill=lambda: logged.append(world.now)) is True
    assert [name for _, name in world.sent] == ["SIGTERM", "SIGCONT", "SIGKILL"]
    assert world.sent[-1][0] >= 2.0 and logged == [world.sent[-1][0]]


def test_a_survivor_of_sigkill_is_reported() -> None:
    world = World()
    assert world.run(grace=1.0, kill_wait=0.5) is False
    assert [name for _, name in world.sent] == ["SIGTERM", "SIGCONT", "SIGKILL"]
    assert world.now >= 1.5


def test_no_wait_after_sigkill_when_asked() -> None:
    world = World()
    assert world.run(grace=1.0, kill_wait=0.0) is False
    assert world.sent[-1] == (world.now, "SIGKILL")


def test_a_list_of_what_is_left_works_as_remaining() -> None:
    left = [1, 2]

    def send(sig: int) -> None:
        if sig == signal.SIGTERM:
            left.pop()
        elif sig == signal.SIGKILL:
            left.clear()

    assert escalate(send, lambda: list(left), 0.3, sleep=lambda s: None) is True and left == []


def test_the_reaper_stays_light() -> None:
    """The reaper runs once per engine and must work when kvwatch is gone: no psutil, no subprocess."""
    probe = ("import json, sys; import kvwatch.watchdog.reaper; "
             "print(json.dumps([m for m in ('psutil', 'subprocess', 'threading', 'kvwatch.boundary.spawn', 'kvwatch.boundary.proc_inspect')"
             " if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []
