"""Restart and correction budget, and backoff (kvwatch/watchdog/budget.py)."""
from __future__ import annotations

from kvwatch.policy import Policy
from kvwatch.watchdog.budget import Budget


def test_backoff_grows_is_bounded_and_resets() -> None:
    budget = Budget(Policy(backoff_initial_seconds=1, backoff_max_seconds=8, max_restarts=100))
    delays = []
    for i in range(8):
        assert budget.take_restart(float(i)) is None
        delays.append(budget.backoff())
    assert 1 <= delays[0] <= 2 and 2 <= delays[1] <= 3 and all(d <= 8 for d in delays) and delays[-1] == 8
    budget.stable()
    assert budget.backoff() <= 2


def test_restart_window_slides() -> None:
    budget = Budget(Policy(max_restarts=2, restart_window_seconds=10))
    assert budget.take_restart(0) is None and budget.take_restart(1) is None
    assert "2 restarts within 10s" in (budget.take_restart(5) or "")
    assert budget.take_restart(11) is None  # the one at 0 left the window


def test_refusals_are_said_without_counting() -> None:
    budget = Budget(Policy(max_restarts=1, restart_window_seconds=10, max_corrections=1))
    assert budget.restart_refusal(0) is None and budget.restart_refusal(0) is None  # asking takes nothing
    assert budget.take_restart(0) is None
    assert "1 restarts within 10s" in (budget.restart_refusal(1) or "")
    assert budget.correction_refusal() is None and budget.take_correction() is None
    assert "1 corrections already" in (budget.correction_refusal() or "")
