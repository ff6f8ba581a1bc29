"""Whether a dead engine's GPU memory is released (kvwatch/watchdog/gpu_release.py): tables of the
GPUs NVML shows x the engine's pids x the used memory before the launch x elapsed and timeout."""
from __future__ import annotations

import pytest

from kvwatch.gpu_types import GpuInfo, GpuProcess, NvmlSnapshot
from kvwatch.watchdog.gpu_release import (
    GpuHold,
    ReleaseOutcome,
    baseline_of,
    gpu_holds,
    release_verdict,
)

GIB = 1 << 30
A, B, C = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"
ENGINE = frozenset({100, 101})


def gpu(uuid: str, used: int | None, *procs: tuple[int, int | None], listed: bool = True) -> GpuInfo:
    processes = tuple(GpuProcess(pid, size) for pid, size in procs) if listed else None
    return GpuInfo(0, uuid, "H100", 80 * GIB, used, (9, 0), processes)


def snap(*gpus: GpuInfo) -> NvmlSnapshot:
    return NvmlSnapshot(True, None, "570", gpus, ())


@pytest.mark.parametrize(("hold", "why"), [
    (GpuHold(A, (100,), 20 * GIB, 21 * GIB, 1 * GIB), "GPU-aaaa: engine pid(s) 100 still hold 20.0 GiB"),
    (GpuHold(A, (100, 101), None, 21 * GIB, None), "GPU-aaaa: engine pid(s) 100, 101 still listed"),
    (GpuHold(A, (), 0, 21 * GIB, 1 * GIB), "GPU-aaaa: 21.0 GiB used, 1.0 GiB before the launch"),
    (GpuHold(A, (), 0, 1 * GIB + (256 << 20), 1 * GIB), None),            # within the slack
    (GpuHold(A, (), 0, 1 * GIB + (257 << 20), 1 * GIB), "GPU-aaaa: 1.3 GiB used, 1.0 GiB before the launch"),
    (GpuHold(A, (), 0, 0, 1 * GIB), None),                                 # below: someone else left
    (GpuHold(A, (), 0, 21 * GIB, None), None),                            # no baseline: the pids decide
    (GpuHold(A, (), 0, None, 1 * GIB), None),                             # used not reported
    (GpuHold(A, seen=False, baseline_bytes=1 * GIB), "GPU-aaaa: not seen by NVML"),
])
def test_why_a_gpu_is_held(hold: GpuHold, why: str | None) -> None:
    assert hold.why_held() == why


@pytest.mark.parametrize(("gpus", "baseline", "holds"), [
    # the engine's pids on two GPUs, another's on a third: the third is not the engine's
    ((gpu(A, 30 * GIB, (100, 20 * GIB), (777, 10 * GIB)), gpu(B, 21 * GIB, (101, 20 * GIB)), gpu(C, 5 * GIB, (9, 5))),
     {A: 10 * GIB, B: 1 * GIB},
     (GpuHold(A, (100,), 20 * GIB, 30 * GIB, 10 * GIB), GpuHold(B, (101,), 20 * GIB, 21 * GIB, 1 * GIB))),
    # a GPU the engine held, no baseline given: found by its pid
    ((gpu(A, 21 * GIB, (101, 20 * GIB), (100, None)),), {},
     (GpuHold(A, (100, 101), None, 21 * GIB, None),)),
    # released: the baseline's GPUs only, clean
    ((gpu(A, 10 * GIB, (777, 10 * GIB)), gpu(B, 1 * GIB)), {A: 10 * GIB, B: 1 * GIB},
     (GpuHold(A, (), 0, 10 * GIB, 10 * GIB), GpuHold(B, (), 0, 1 * GIB, 1 * GIB))),
    # no per-process list: only the used memory
    ((gpu(A, 21 * GIB, listed=False),), {A: 1 * GIB}, (GpuHold(A, (), 0, 21 * GIB, 1 * GIB),)),
    # a baseline GPU NVML no longer shows
    ((gpu(A, 1 * GIB),), {A: 1 * GIB, B: 2 * GIB},
     (GpuHold(A, (), 0, 1 * GIB, 1 * GIB), GpuHold(B, seen=False, baseline_bytes=2 * GIB))),
])
def test_the_gpus_the_engine_may_hold(gpus: tuple[GpuInfo, ...], baseline: dict[str, int | None],
                                      holds: tuple[GpuHold, ...]) -> None:
    assert gpu_holds(snap(*gpus), ENGINE, baseline) == holds


HELD = GpuHold(A, (100,), 20 * GIB, 21 * GIB, 1 * GIB)
CLEAN = GpuHold(B, (), 0, 1 * GIB, 1 * GIB)


@pytest.mark.parametrize(("holds", "elapsed", "outcome", "text"), [
    ((CLEAN,), 0.0, ReleaseOutcome.RELEASED, "GPU memory released (GPU-bbbb) after 0.0 s"),
    ((), 0.0, ReleaseOutcome.RELEASED, "GPU memory released (no GPU) after 0.0 s"),
    ((HELD, CLEAN), 2.0, ReleaseOutcome.WAIT, "waiting for GPU memory: GPU-aaaa: engine pid(s) 100 still hold 20.0 GiB"),
    ((HELD, CLEAN), 29.9, ReleaseOutcome.WAIT, "waiting for GPU memory: GPU-aaaa: engine pid(s) 100 still hold 20.0 GiB"),
    ((HELD, CLEAN), 30.0, ReleaseOutcome.TIMED_OUT,
     "GPU memory not released after 30.0 s: GPU-aaaa: engine pid(s) 100 still hold 20.0 GiB"),
    ((CLEAN,), 45.0, ReleaseOutcome.RELEASED, "GPU memory released (GPU-bbbb) after 45.0 s"),  # clean wins
])
def test_the_verdict(holds: tuple[GpuHold, ...], elapsed: float, outcome: ReleaseOutcome, text: str) -> None:
    verdict = release_verdict(holds, elapsed, 30.0)
    assert (verdict.outcome, verdict.text, verdict.elapsed_s) == (outcome, text, elapsed)
    assert verdict.held == tuple(h for h in holds if h is HELD)


def test_the_baseline_is_the_used_memory_before_the_launch() -> None:
    snapshot = snap(gpu(A, 10 * GIB), gpu(B, None), gpu(C, 3 * GIB))
    assert baseline_of(snapshot) == {A: 10 * GIB, B: None, C: 3 * GIB}
    assert baseline_of(snapshot, {A, "GPU-gone"}) == {A: 10 * GIB}
