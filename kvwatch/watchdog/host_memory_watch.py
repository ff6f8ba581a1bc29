"""Whether the host's memory is about to wedge the host: OK, WARN or STOP, from MemAvailable and the
memory pressure (PSI) the boundary samples (pure).

On unified-memory hosts (GB10 / DGX Spark, Grace) the GPU's memory is the host's: vLLM's profile or a
long prefill can take the host down to a wedge with no OOM kill at all, so kvwatch must stop the
engine group itself while it still can. STOP needs its condition over `sustain` samples in a row (a
page-cache dip or one burst of reclaim is no wedge), except under the hard floor, where the next
second may be too late. The thresholds are data, with defaults for hosts of 16 GiB to 1 TiB.
"""
from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.values.host_memory import HostMemorySample
from kvwatch.watchdog.records import HostMemoryStop

_GIB = 1 << 30


@dataclass(frozen=True)
class HostMemoryThresholds:
    # STOP: MemAvailable under the larger of these, or full pressure at or over stop_full_avg10 ...
    stop_available_bytes: int = 1 * _GIB
    stop_available_ratio: float = 0.03
    stop_full_avg10: float = 40.0
    sustain: int = 3                               # ... for this many samples in a row
    hard_available_bytes: int = 256 << 20          # STOP at once under this
    # WARN: MemAvailable under the larger of these, or pressure at or over either bound
    warn_available_bytes: int = 2 * _GIB
    warn_available_ratio: float = 0.08
    warn_full_avg10: float = 10.0
    warn_some_avg10: float = 30.0


DEFAULT_THRESHOLDS = HostMemoryThresholds()


class HostMemoryLevel(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    STOP = "stop"   # stop the engine group now, before the host wedges


@dataclass(frozen=True)
class HostMemoryVerdict:
    level: HostMemoryLevel
    reason: str                          # "" when OK
    sample: HostMemorySample | None      # the newest sample judged


def _floor(sample: HostMemorySample, floor_bytes: int, ratio: float) -> int:
    return max(floor_bytes, int(sample.total_bytes * ratio)) if sample.total_bytes else floor_bytes


def _gib(n: int) -> str:
    return f"{n / _GIB:.1f} GiB" if n >= _GIB else f"{n >> 20} MiB"


def _available(sample: HostMemorySample, floor: int) -> str:
    total = f" of {_gib(sample.total_bytes)}" if sample.total_bytes else ""
    return f"MemAvailable {_gib(sample.available_bytes or 0)}{total}, under {_gib(floor)}"


def _stop_reason(sample: HostMemorySample, t: HostMemoryThresholds) -> str | None:
    floor = _floor(sample, t.stop_available_bytes, t.stop_available_ratio)
    if sample.available_bytes is not None and sample.available_bytes < floor:
        return _available(sample, floor)
    if sample.full_avg10 is not None and sample.full_avg10 >= t.stop_full_avg10:
        return f"memory pressure full avg10 {sample.full_avg10:.1f}%, at or over {t.stop_full_avg10:g}%"
    return None


def _warn_reason(sample: HostMemorySample, t: HostMemoryThresholds) -> str | None:
    floor = _floor(sample, t.warn_available_bytes, t.warn_available_ratio)
    if sample.available_bytes is not None and sample.available_bytes < floor:
        return _available(sample, floor)
    if sample.full_avg10 is not None and sample.full_avg10 >= t.warn_full_avg10:
        return f"memory pressure full avg10 {sample.full_avg10:.1f}%, at or over {t.warn_full_avg10:g}%"
    if sample.some_avg10 is not None and sample.some_avg10 >= t.warn_some_avg10:
        return f"memory pressure some avg10 {sample.some_avg10:.1f}%, at or over {t.warn_some_avg10:g}%"
    return None


def host_memory_verdict(samples: Sequence[HostMemorySample],
                        thresholds: HostMemoryThresholds = DEFAULT_THRESHOLDS) -> HostMemoryVerdict:
    """Judge the newest samples (oldest first): STOP, WARN (a stop condition not yet sustained counts
    as a warning) or OK."""
    if not samples:
        return HostMemoryVerdict(HostMemoryLevel.OK, "", None)
    last = samples[-1]
    if last.available_bytes is not None and last.available_bytes < thresholds.hard_available_bytes:
        return HostMemoryVerdict(HostMemoryLevel.STOP, _available(last, thresholds.hard_available_bytes), last)
    recent = samples[-thresholds.sustain:]
    stop = _stop_reason(last, thresholds)
    if stop is not None and len(recent) >= thresholds.sustain \
            and all(_stop_reason(s, thresholds) is not None for s in recent):
        return HostMemoryVerdict(HostMemoryLevel.STOP, f"{stop} for {len(recent)} samples in a row", last)
    warn = stop or _warn_reason(last, thresholds)
    if warn is not None:
        return HostMemoryVerdict(HostMemoryLevel.WARN, warn, last)
    return HostMemoryVerdict(HostMemoryLevel.OK, "", last)


class HostMemoryWindow:
    """The newest samples, as many as the thresholds look back on: the watch adds one per tick and acts
    on the verdict."""

    def __init__(self, thresholds: HostMemoryThresholds = DEFAULT_THRESHOLDS) -> None:
        self.thresholds = thresholds
        self._samples: deque[HostMemorySample] = deque(maxlen=max(1, thresholds.sustain))

    def add(self, sample: HostMemorySample) -> HostMemoryVerdict:
        self._samples.append(sample)
        return host_memory_verdict(list(self._samples), self.thresholds)


def stop_record(verdict: HostMemoryVerdict, phase: str, argv: Sequence[str], now: float,
                boot_id: str) -> HostMemoryStop:
    """The record saved before the engine group is stopped for host memory."""
    sample = verdict.sample
    return HostMemoryStop(now, phase, verdict.reason, list(argv),
                          sample.available_bytes if sample else None, sample.total_bytes if sample else None,
                          sample.some_avg10 if sample else None, sample.full_avg10 if sample else None, boot_id)


def describe_stop(stop: HostMemoryStop, boot_id: str) -> str:
    """What the next start says of a stop for host memory; `boot_id` is this boot's."""
    if not (stop.boot_id and boot_id):
        since = "boot not known"
    else:
        since = "on this boot" if stop.boot_id == boot_id else "the host has rebooted since"
    return f"kvwatch stopped the engine for host memory while {stop.phase or 'running'} ({since}): {stop.reason}"
