"""The bounded wait for a dead engine's GPU memory (kvwatch/watchdog/gpu_release_wait.py), read through
the real nvidia-ml-py from the NVML stand-in (tests/nvml_standin). The driver frees memory as time
passes: the test's sleep advances a fake clock and rewrites the stand-in's state, which the fake
driver rereads on every call."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from nvml_standin import GIB, NvmlStandin, StandinGpu, StandinProcess, StandinState

from kvwatch.boundary.nvml import Nvml
from kvwatch.watchdog.gpu_release import ReleaseOutcome, ReleaseVerdict, baseline_of
from kvwatch.watchdog.gpu_release_wait import wait_for_release

A = "GPU-0f1e2d3c-aaaa-4bbb-8ccc-000000000000"
B = "GPU-9a8b7c6d-dddd-4eee-8fff-111111111111"
ENGINE = (4242, 4243)   # the dead engine's two workers, one per GPU (tensor parallel 2)
OTHER = 777             # someone else's process on GPU A, there before the launch


def state(a_procs: list[StandinProcess], b_procs: list[StandinProcess], a_used: int, b_used: int,
          **gpu_b: Any) -> StandinState:
    return StandinState(gpus=[
        StandinGpu(uuid=A, memory_used_bytes=a_used, processes=a_procs),
        StandinGpu(uuid=B, memory_used_bytes=b_used, processes=b_procs, **gpu_b),
    ])


BEFORE = state([StandinProcess(OTHER, 4 * GIB)], [], 4 * GIB, 0)   # the GPUs before the launch
HELD = state([StandinProcess(OTHER, 4 * GIB), StandinProcess(ENGINE[0], 60 * GIB)],
             [StandinProcess(ENGINE[1], 60 * GIB)], 64 * GIB, 60 * GIB)
A_FREED = state([StandinProcess(OTHER, 4 * GIB)], [StandinProcess(ENGINE[1], 60 * GIB)], 4 * GIB, 60 * GIB)


class Timeline:
    """A fake clock whose sleep moves time on and plays the driver's changes due by then."""

    def __init__(self, standin: NvmlStandin, changes: dict[float, StandinState]) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self._standin, self._changes, self._start = standin, dict(sorted(changes.items())), 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        for at in [t for t in self._changes if t <= self.now - self._start]:
            self._standin.write(self._changes.pop(at))


@pytest.fixture
def nvml(nvml_standin: NvmlStandin) -> Iterator[Nvml]:
    nvml_standin.write(BEFORE)
    with Nvml() as handle:
        yield handle


def wait(nvml: Nvml, timeline: Timeline, baseline: dict[str, int | None], timeout: float = 30.0,
         stopping: Callable[[], bool] = lambda: False) -> ReleaseVerdict:
    return wait_for_release(nvml.snapshot, ENGINE, baseline, timeout, clock=timeline.clock,
                            sleep=timeline.sleep, poll_s=0.5, stopping=stopping)


def test_waits_until_every_gpu_the_engine_held_is_released(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    baseline = baseline_of(nvml.snapshot())   # before the launch
    assert baseline == {A: 4 * GIB, B: 0}
    nvml_standin.write(HELD)                  # the engine died; the driver has not freed its memory yet
    timeline = Timeline(nvml_standin, {1.0: A_FREED, 2.5: BEFORE})
    verdict = wait(nvml, timeline, baseline)
    assert verdict.outcome is ReleaseOutcome.RELEASED
    assert verdict.elapsed_s == 2.5 and timeline.sleeps == [0.5] * 5
    assert verdict.text == f"GPU memory released ({A}, {B}) after 2.5 s"


def test_released_at_once_without_sleeping(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    timeline = Timeline(nvml_standin, {})
    verdict = wait(nvml, timeline, {A: 4 * GIB, B: 0})
    assert (verdict.outcome, verdict.elapsed_s, timeline.sleeps) == (ReleaseOutcome.RELEASED, 0.0, [])


def test_times_out_naming_what_still_holds_memory(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(HELD)
    timeline = Timeline(nvml_standin, {1.0: A_FREED})
    verdict = wait(nvml, timeline, {A: 4 * GIB, B: 0}, timeout=3.2)
    assert verdict.outcome is ReleaseOutcome.TIMED_OUT
    assert verdict.elapsed_s == pytest.approx(3.2) and timeline.sleeps[-1] == pytest.approx(0.2)
    assert verdict.text == f"GPU memory not released after 3.2 s: {B}: engine pid(s) 4243 still hold 60.0 GiB"
    assert [h.uuid for h in verdict.held] == [B]


def test_without_per_process_memory_the_used_memory_decides(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    # a driver that lists no processes (or a container whose pids NVML does not report as the engine's)
    no_list = {"processes": "NOT_SUPPORTED"}
    nvml_standin.write(state([], [], 4 * GIB, 60 * GIB, errors=no_list))
    timeline = Timeline(nvml_standin, {2.0: state([], [], 4 * GIB, 100 << 20, errors=no_list)})
    verdict = wait(nvml, timeline, {A: 4 * GIB, B: 0})
    assert (verdict.outcome, verdict.elapsed_s) == (ReleaseOutcome.RELEASED, 2.0)


def test_a_gpu_lost_meanwhile_is_held_until_the_timeout(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(state([StandinProcess(OTHER, 4 * GIB)], [], 4 * GIB, 0, lost=True))
    verdict = wait(nvml, Timeline(nvml_standin, {}), {A: 4 * GIB, B: 0}, timeout=1.0)
    assert verdict.outcome is ReleaseOutcome.TIMED_OUT
    assert verdict.text == f"GPU memory not released after 1.0 s: {B}: not seen by NVML"


def test_nvml_unavailable_is_not_waited_on(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml.shutdown()
    nvml_standin.write(StandinState(gpus=HELD.gpus, init_error="DRIVER_NOT_LOADED"))
    timeline = Timeline(nvml_standin, {})
    verdict = wait(nvml, timeline, {A: 4 * GIB})
    assert (verdict.outcome, timeline.sleeps) == (ReleaseOutcome.UNAVAILABLE, [])
    assert verdict.text == "GPU memory release not checked: nvmlInit: Driver Not Loaded"


def test_a_stop_request_cancels_the_wait(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(HELD)
    timeline = Timeline(nvml_standin, {})
    verdict = wait(nvml, timeline, {A: 4 * GIB, B: 0}, stopping=lambda: timeline.now >= 101.0)
    assert (verdict.outcome, verdict.elapsed_s) == (ReleaseOutcome.CANCELLED, 1.0)
    assert [h.uuid for h in verdict.held] == [A, B]


def test_the_supervisors_evidence_waits_from_the_launchs_own_baseline(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    """LaunchEvidence (what the supervisor calls): the baseline is read before the launch, the wait after the
    death, and its outcome counted for kvwatch_gpu_release_waits_total."""
    from fake_os import FakeClock, FakeOs

    from kvwatch.watchdog.launch_evidence import LaunchEvidence

    evidence = LaunchEvidence(FakeOs(FakeClock(), []), nvml.snapshot)
    evidence.before_launch()                      # BEFORE: someone else's 4 GiB on A
    nvml_standin.write(HELD)                      # the engine ran, died, and its memory is still held
    timeline = Timeline(nvml_standin, {1.0: A_FREED, 2.0: BEFORE})
    verdict = evidence.wait_gpu_release(ENGINE, timeline.clock, timeline.sleep, lambda: False)
    assert verdict is not None and verdict.outcome is ReleaseOutcome.RELEASED and verdict.elapsed_s == 2.0
    assert (evidence.release_waits, evidence.last_release_wait) == ({"released": 1}, 2.0)
    off_cuda = LaunchEvidence(FakeOs(FakeClock(), []), lambda: None)
    assert off_cuda.wait_gpu_release(ENGINE, timeline.clock, timeline.sleep, lambda: False) is None
