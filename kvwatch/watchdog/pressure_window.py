"""The engine's load over a window, as the pressure recommender reads it (pure).

Samples are the engine's own series at each look (counters as they stand, gauges as they are);
the window is the span from the oldest sample within `seconds` of the newest to the newest:
counter increases over it, gauge means, and the lengths of the requests that finished in it.
A counter that went down (the engine restarted) starts the window after the drop.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.planner.pressure import Window

Buckets = tuple[tuple[float, float], ...]   # (le, cumulative count), le ascending


@dataclass(frozen=True)
class LoadSample:
    at: float
    preemptions: float | None
    kv_usage: float | None = None
    waiting: float | None = None
    request_tokens: float | None = None     # prompt + generated tokens of every finished request
    requests: float | None = None           # finished requests
    prompt_buckets: Buckets = ()
    generation_buckets: Buckets = ()
    generated_tokens: float | None = None   # vllm:generation_tokens_total


def window_of(samples: Sequence[LoadSample], seconds: float, gpu_free_bytes: int | None = None,
              gpus_unused: int = 0) -> Window | None:
    """The window ending at the newest sample; None with fewer than two usable samples."""
    usable = [s for s in samples if s.preemptions is not None]
    if len(usable) < 2:
        return None
    newest = usable[-1]
    start = 0
    for i in range(1, len(usable)):
        if _dropped(usable[i - 1], usable[i]):
            start = i
    span = [s for s in usable[start:] if newest.at - s.at <= seconds]
    if len(span) < 2:
        return None
    first = span[0]
    assert first.preemptions is not None and newest.preemptions is not None
    finished = _delta(first.requests, newest.requests)
    tokens = _delta(first.request_tokens, newest.request_tokens)
    longest = None
    if finished:
        prompt = _bound_of_all(first.prompt_buckets, newest.prompt_buckets)
        generated = _bound_of_all(first.generation_buckets, newest.generation_buckets)
        if prompt is not None and generated is not None:
            longest = int(prompt + generated)   # an upper bound: each at its bucket's top
    return Window(
        seconds=newest.at - first.at,
        preemptions=newest.preemptions - first.preemptions,
        kv_usage=_mean([s.kv_usage for s in span]),
        waiting=_mean([s.waiting for s in span]),
        mean_request_tokens=tokens / finished if finished and tokens is not None else None,
        max_request_tokens=longest,
        gpu_free_bytes=gpu_free_bytes,
        gpus_unused=gpus_unused,
        generated_tokens=_delta(first.generated_tokens, newest.generated_tokens),
    )


def _dropped(before: LoadSample, after: LoadSample) -> bool:
    pairs = ((before.preemptions, after.preemptions), (before.requests, after.requests),
             (before.generated_tokens, after.generated_tokens))
    return any(b is not None and a is not None and a < b for b, a in pairs)


def _delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return after - before


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _bound_of_all(before: Buckets, after: Buckets) -> float | None:
    """The smallest bucket bound under which every request that finished in the window lies."""
    old = dict(before)
    total = None
    rows = [(le, count - old.get(le, 0.0)) for le, count in after]
    if not rows:
        return None
    total = rows[-1][1]
    for le, count in rows:
        if count >= total:
            return le
    return None
