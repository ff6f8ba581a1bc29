"""The health probe, asked on a pool thread so that the watchdog's loop is never held by it.

A slow or dripping engine (each exchange has its deadline) never holds the watchdog's own stop, its
timers or the systemd watchdog ping: the loop waits for the answer in short slices and gives up on
it when a stop request or the engine's exit comes first.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

_LOG = logging.getLogger(__name__)

Probe = Callable[[str, float, bool], bool]   # (url, timeout, starting) -> healthy
T = TypeVar("T")


class ProbePool:
    def __init__(self, probe: Probe, slice_seconds: float = 0.1) -> None:
        self._probe = probe
        self._slice = slice_seconds
        self._pool: ThreadPoolExecutor | None = None

    def ask(self, url: str, timeout: float, starting: bool, interrupted: Callable[[], bool],
            waiting: Callable[[], object]) -> bool | None:
        """The probe's answer, or None when `interrupted()` turns true first; `waiting()` is called
        at each slice (the systemd watchdog ping). A probe that raises is an unhealthy engine."""
        return self._wait(self._submit(self._probe, url, timeout, starting), interrupted, waiting, False)

    def read(self, call: Callable[[], T], interrupted: Callable[[], bool], waiting: Callable[[], object]) -> T | None:
        """`call()` on a pool thread (reading the engine's counters, with its own deadline), or None
        when `interrupted()` turns true first or it raises."""
        return self._wait(self._submit(call), interrupted, waiting, None)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvwatch-probe")
        return self._pool.submit(fn, *args)

    def _wait(self, future: Future[Any], interrupted: Callable[[], bool], waiting: Callable[[], object],
              failed: Any) -> Any:
        while True:
            try:
                return future.result(timeout=self._slice)
            except FutureTimeout:
                if interrupted():
                    return None
                waiting()
            except Exception as exc:  # a probe never raises; if it does, the engine is not healthy
                _LOG.warning("probe failed: %r", exc)
                return failed
