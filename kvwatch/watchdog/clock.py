"""The supervisor's time: monotonic, and every wait on an Event (a stop request is never stuck behind
a backoff or a probe interval). Tests give the supervisor a fake (tests/fake_os.FakeClock)."""
from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...
    def wait(self, event: threading.Event, seconds: float) -> bool: ...
    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
