"""Wait, bounded, until a dead engine's GPU memory is released (the decision: gpu_release.py).

The clock, the sleep and the NVML read are passed in: the supervisor passes its own (a sleep that a
stop request cuts short, with `stopping`), tests a fake clock over the NVML stand-in.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from kvwatch.gpu_types import NvmlSnapshot
from kvwatch.watchdog.gpu_release import (
    DEFAULT_POLL_S,
    DEFAULT_SLACK_BYTES,
    DEFAULT_TIMEOUT_S,
    ReleaseOutcome,
    ReleaseVerdict,
    gpu_holds,
    release_verdict,
)

_LOG = logging.getLogger(__name__)


def wait_for_release(snapshot: Callable[[], NvmlSnapshot], engine_pids: Collection[int],
                     baseline: Mapping[str, int | None], timeout_s: float = DEFAULT_TIMEOUT_S, *,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] = time.sleep,
                     poll_s: float = DEFAULT_POLL_S, slack_bytes: int = DEFAULT_SLACK_BYTES,
                     stopping: Callable[[], bool] = lambda: False) -> ReleaseVerdict:
    """Poll NVML every `poll_s` until the engine's GPUs are clean, `timeout_s` passed, NVML cannot
    tell or `stopping()`; the verdict says which, how long it took and what still held memory."""
    start = clock()
    while True:
        elapsed = clock() - start
        snap = snapshot()
        if not snap.available:
            verdict = ReleaseVerdict(ReleaseOutcome.UNAVAILABLE, elapsed, (),
                                     f"GPU memory release not checked: {snap.error or 'NVML not available'}")
            break
        verdict = release_verdict(gpu_holds(snap, engine_pids, baseline), elapsed, timeout_s, slack_bytes)
        if verdict.outcome is not ReleaseOutcome.WAIT:
            break
        if stopping():
            verdict = ReleaseVerdict(ReleaseOutcome.CANCELLED, elapsed, verdict.held,
                                     f"GPU memory wait cancelled after {elapsed:.1f} s (stopping)")
            break
        sleep(max(0.0, min(poll_s, timeout_s - elapsed)))
    log = _LOG.warning if verdict.outcome is ReleaseOutcome.TIMED_OUT else _LOG.info
    log("%s", verdict.text)
    return verdict
