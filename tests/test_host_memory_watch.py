"""Host memory on a unified-memory host (kvwatch/watchdog/host_memory_watch.py): a table of sample
series x thresholds -> OK, WARN or STOP, and the record a stop leaves for the next start."""
from __future__ import annotations

import pytest

from kvwatch.values.host_memory import HostMemorySample
from kvwatch.watchdog.host_memory_watch import (
    HostMemoryLevel,
    HostMemoryThresholds,
    HostMemoryVerdict,
    HostMemoryWindow,
    describe_stop,
    host_memory_verdict,
    stop_record,
)
from kvwatch.watchdog.records import HostMemoryStop

GIB = 1 << 30
SPARK = 119 * GIB    # a GB10's MemTotal: STOP under 3.6 GiB (3 %), WARN under 9.5 GiB (8 %)
OK, WARN, STOP = HostMemoryLevel.OK, HostMemoryLevel.WARN, HostMemoryLevel.STOP


def s(available_gib: float | None, some: float | None = 0.0, full: float | None = 0.0,
      total: int | None = SPARK) -> HostMemorySample:
    available = None if available_gib is None else int(available_gib * GIB)
    return HostMemorySample(0.0, available, total, some, full)


@pytest.mark.parametrize(("samples", "level", "reason"), [
    ((), OK, ""),
    ((s(60),), OK, ""),
    # MemAvailable falling: a warning, then STOP once it holds under the floor for 3 samples
    ((s(60), s(9)), WARN, "MemAvailable 9.0 GiB of 119.0 GiB, under 9.5 GiB"),
    ((s(9), s(3), s(3)), WARN, "MemAvailable 3.0 GiB of 119.0 GiB, under 3.6 GiB"),
    ((s(3), s(3), s(3)), STOP, "MemAvailable 3.0 GiB of 119.0 GiB, under 3.6 GiB for 3 samples in a row"),
    ((s(60), s(3), s(2), s(1)), STOP, "MemAvailable 1.0 GiB of 119.0 GiB, under 3.6 GiB for 3 samples in a row"),
    ((s(3), s(3), s(20)), OK, ""),                    # recovered
    ((s(3), s(20), s(3)), WARN, "MemAvailable 3.0 GiB of 119.0 GiB, under 3.6 GiB"),  # not in a row
    # under the hard floor: STOP at once
    ((s(0.2),), STOP, "MemAvailable 204 MiB of 119.0 GiB, under 256 MiB"),
    # memory pressure: every task stalled (full) wedges the host before MemAvailable says so
    ((s(30, full=12),), WARN, "memory pressure full avg10 12.0%, at or over 10%"),
    ((s(30, some=35),), WARN, "memory pressure some avg10 35.0%, at or over 30%"),
    ((s(30, full=45), s(30, full=50), s(30, full=62.5)), STOP,
     "memory pressure full avg10 62.5%, at or over 40% for 3 samples in a row"),
    ((s(30, full=45), s(2), s(30, full=50)), STOP,   # a different stop condition each time: still in a row
     "memory pressure full avg10 50.0%, at or over 40% for 3 samples in a row"),
    # a kernel without PSI, or without MemAvailable: the other figure alone
    ((s(3, None, None), s(3, None, None), s(3, None, None)), STOP,
     "MemAvailable 3.0 GiB of 119.0 GiB, under 3.6 GiB for 3 samples in a row"),
    ((s(None, 0, 45), s(None, 0, 45), s(None, 0, 45)), STOP,
     "memory pressure full avg10 45.0%, at or over 40% for 3 samples in a row"),
    ((s(None, None, None),), OK, ""),
    # a small host: the byte floors hold (1 GiB to stop, 2 GiB to warn), not 3 % of 16 GiB
    ((s(1.5, total=16 * GIB),), WARN, "MemAvailable 1.5 GiB of 16.0 GiB, under 2.0 GiB"),
    ((s(0.9, total=16 * GIB),) * 3, STOP, "MemAvailable 921 MiB of 16.0 GiB, under 1.0 GiB for 3 samples in a row"),
    ((s(0.9, total=None),) * 3, STOP, "MemAvailable 921 MiB, under 1.0 GiB for 3 samples in a row"),
])
def test_the_verdict(samples: tuple[HostMemorySample, ...], level: HostMemoryLevel, reason: str) -> None:
    verdict = host_memory_verdict(samples)
    assert (verdict.level, verdict.reason) == (level, reason)
    assert verdict.sample is (samples[-1] if samples else None)


def test_thresholds_are_data() -> None:
    strict = HostMemoryThresholds(stop_available_ratio=0.25, sustain=1, warn_some_avg10=5.0)
    assert host_memory_verdict([s(20)], strict).level is STOP
    assert host_memory_verdict([s(40, some=6)], strict).reason == "memory pressure some avg10 6.0%, at or over 5%"
    assert host_memory_verdict([s(20)]).level is OK


BOOT, OTHER_BOOT = "6d9f3c2e-1b2a-4c3d-8e4f-5a6b7c8d9e0f", "0e9d8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b"


def test_the_stop_record_and_what_the_next_start_says() -> None:
    verdict = host_memory_verdict([s(3, 20, 45)] * 3)
    stop = stop_record(verdict, "profiling", ["vllm", "serve", "m"], 1_800_000_000.0, BOOT)
    assert stop == HostMemoryStop(1_800_000_000.0, "profiling", verdict.reason, ["vllm", "serve", "m"],
                                  3 * GIB, SPARK, 20.0, 45.0, BOOT)
    said = "kvwatch stopped the engine for host memory while profiling ({}): " + verdict.reason
    assert describe_stop(stop, OTHER_BOOT) == said.format("the host has rebooted since")
    assert describe_stop(stop, BOOT) == said.format("on this boot")
    assert describe_stop(stop, "") == said.format("boot not known")
    empty = stop_record(HostMemoryVerdict(STOP, "r", None), "", [], 1.0, "")
    assert (empty.available_bytes, empty.full_avg10) == (None, None)
    assert describe_stop(empty, BOOT) == "kvwatch stopped the engine for host memory while running (boot not known): r"


def test_the_window_judges_the_newest_samples() -> None:
    window = HostMemoryWindow()
    levels = [window.add(sample).level for sample in (s(60), s(3), s(3), s(3), s(3), s(20), s(3))]
    assert levels == [OK, WARN, WARN, STOP, STOP, OK, WARN]
    one = HostMemoryWindow(HostMemoryThresholds(sustain=1))
    assert one.add(s(3)).level is STOP
