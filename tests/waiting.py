"""One way for a test to wait for something that happens on another thread or process."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Call `predicate` every `interval` seconds until it returns something true or `timeout`
    seconds have passed; return its last value (false when it timed out: the caller asserts)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(interval)
