"""How many more tries the watchdog has, and how long to wait before the next (pure but for jitter).

Restarts (same plan) are bounded per sliding window, corrections (a changed plan) per
run of kvwatch; the backoff grows with each consecutive failure (tenacity's exponential
wait with jitter) and starts over once the engine has been READY for stable_seconds.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import wait_exponential_jitter

from kvwatch.policy import Policy


@dataclass(frozen=True)
class _Attempt:
    """The one field of tenacity's RetryCallState that its wait strategies read."""

    attempt_number: int


def _strategy(policy: Policy) -> Callable[[Any], float]:
    try:  # tenacity >= 9 names the base `multiplier` (and deprecates `initial`)
        return wait_exponential_jitter(multiplier=policy.backoff_initial_seconds, max=policy.backoff_max_seconds,
                                       jitter=policy.backoff_initial_seconds)
    except TypeError:
        return wait_exponential_jitter(initial=policy.backoff_initial_seconds, max=policy.backoff_max_seconds,
                                       jitter=policy.backoff_initial_seconds)


class Budget:
    def __init__(self, policy: Policy, wait: Callable[[Any], float] | None = None) -> None:
        self.policy = policy
        self._wait = wait or _strategy(policy)
        self._restarts: deque[float] = deque()
        self.corrections = 0
        self.consecutive = 0        # failures since the engine was last stable

    def stable(self) -> None:
        self.consecutive = 0

    def restart_refusal(self, now: float) -> str | None:
        """Why a restart with the same plan would be refused now (the window is full); None if not."""
        window = self.policy.restart_window_seconds
        while self._restarts and now - self._restarts[0] > window:
            self._restarts.popleft()
        if len(self._restarts) >= self.policy.max_restarts:
            return f"{len(self._restarts)} restarts within {window:.0f}s (policy.max_restarts)"
        return None

    def correction_refusal(self) -> str | None:
        """Why a corrected plan would be refused now (too many already); None if not."""
        if self.corrections >= self.policy.max_corrections:
            return f"{self.corrections} corrections already (policy.max_corrections)"
        return None

    def take_restart(self, now: float) -> str | None:
        """Count a restart with the same plan; a reason to give up when the window is full."""
        why = self.restart_refusal(now)
        if why is None:
            self._restarts.append(now)
            self.consecutive += 1
        return why

    def take_correction(self) -> str | None:
        why = self.correction_refusal()
        if why is None:
            self.corrections += 1
            self.consecutive += 1
        return why

    def backoff(self) -> float:
        return float(self._wait(_Attempt(max(1, self.consecutive))))
