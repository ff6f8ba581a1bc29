"""kvwatch export's judge of a serving engine (kvwatch.exporter.serving), on an injected clock: what
the pure decisions find becomes the engine's status (a stall counted once, its evidence while it lasts,
the recommendation), and a read that failed judges nothing."""
from __future__ import annotations

from kvwatch.boundary.engine_http import EngineLoad, EngineMetrics
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exporter.serving import ServingJudge

STATUS = EngineStatus("ext", EngineState.READY, failures={"engine_died": 2})


def page(running: float, prompt: float, generated: float) -> EngineMetrics:
    return EngineMetrics(True, load=EngineLoad(running=running, prompt_tokens=prompt, generation_tokens=generated))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# (seconds later, the page read then, stalls counted after it, stalled now)
STEPS = [
    (0, page(0, 10, 5), 0, False),     # idle
    (5, page(0, 10, 5), 0, False),     # idle for long: never a stall
    (1, page(1, 10, 5), 0, False),     # a request: the window opens
    (1, page(1, 10, 6), 0, False),     # a token: it reopens
    (1, page(1, 10, 6), 0, False),
    (1, page(1, 10, 6), 1, True),      # 2 s still, the timeout: one stall
    (1, page(1, 10, 6), 1, True),      # it lasts: still one
    (1, None, 1, True),                # the engine did not answer: nothing judged, the stall stands
    (1, EngineMetrics.failed("HTTP 500"), 1, True),
    (1, page(1, 10, 7), 1, False),     # a token: over, still one counted
    (1, page(1, 10, 7), 1, False),
    (1, page(1, 10, 7), 2, True),      # a second stall
]


def test_a_stall_is_counted_once_and_lasts_until_a_token() -> None:
    clock = Clock()
    judge = ServingJudge("ext", stall_timeout=2.0, pressure_window=60.0, clock=clock)
    for i, (later, metrics, stalls, stalled) in enumerate(STEPS):
        clock.now += later
        judge.observe(metrics, None, None, lambda _change: None)
        status = judge.status(STATUS)
        assert status.failures.get("stalled", 0) == stalls, (i, status.failures)
        assert status.failures["engine_died"] == 2
        assert (status.ending is not None) == stalled, (i, status.ending)
        if stalled:
            assert status.ending is not None and status.ending.startswith("stalled: 1 requests running and no token")
            assert status.last_failure == "stalled"
        assert status.state is EngineState.READY and status.recommendation is None


def test_a_stall_timeout_of_0_judges_no_stall() -> None:
    clock = Clock()
    judge = ServingJudge("ext", stall_timeout=0.0, pressure_window=60.0, clock=clock)
    for _ in range(10):
        clock.now += 10
        judge.observe(page(1, 10, 5), None, None, lambda _change: None)
    status = judge.status(STATUS)
    assert "stalled" not in status.failures and status.ending is None and status.last_failure is None
