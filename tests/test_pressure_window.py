"""The engine's load over a window (kvwatch.watchdog.pressure_window), as a table."""
from __future__ import annotations

import pytest

from kvwatch.watchdog.pressure_window import LoadSample, window_of

BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)


def buckets(lengths: list[int]) -> tuple[tuple[float, float], ...]:
    return tuple((le, float(sum(1 for n in lengths if n <= le))) for le in BOUNDS)


def sample(at: float, preemptions: float, prompts: list[int] = (), gens: list[int] = (), **kw: float) -> LoadSample:
    return LoadSample(at, preemptions, request_tokens=float(sum(prompts) + sum(gens)), requests=float(len(prompts)),
                      prompt_buckets=buckets(list(prompts)), generation_buckets=buckets(list(gens)), **kw)


def test_counters_increase_gauges_average_and_lengths_come_from_the_finished_requests() -> None:
    w = window_of([sample(0, 10, [100], [50], kv_usage=0.5, waiting=0),
                   sample(60, 25, [100, 300, 400], [50, 100, 30], kv_usage=0.9, waiting=2),
                   sample(120, 40, [100, 300, 400, 150], [50, 100, 30, 10], kv_usage=1.0, waiting=4)], 300)
    assert w is not None
    assert (w.seconds, w.preemptions) == (120, 30)
    assert w.kv_usage == pytest.approx(0.8) and w.waiting == pytest.approx(2)
    assert w.mean_request_tokens == pytest.approx((300 + 100 + 400 + 30 + 150 + 10) / 3)
    assert w.max_request_tokens == 500 + 100      # bucket tops: a prompt <= 500, a generation <= 100


def test_only_samples_within_the_window_count() -> None:
    w = window_of([sample(0, 0), sample(100, 50), sample(500, 60), sample(600, 61)], 150)
    assert w is not None and (w.seconds, w.preemptions) == (100, 1)   # 500 and 600 only


@pytest.mark.parametrize("samples", [
    [],
    [sample(0, 5)],
    [LoadSample(0, None), LoadSample(10, None)],     # an engine without the counter
    [sample(0, 500), sample(10, 3)],                 # a restart: only one sample after it
])
def test_no_window_without_two_usable_samples(samples: list[LoadSample]) -> None:
    assert window_of(samples, 300) is None


def test_a_restart_starts_the_window_after_it() -> None:
    w = window_of([sample(0, 500), sample(10, 3), sample(20, 9)], 300)
    assert w is not None and (w.seconds, w.preemptions) == (10, 6)
    assert w.mean_request_tokens is None and w.max_request_tokens is None   # nothing finished in it
