"""The text exposition rendered family by family, each family's text kept from one render to the next.

prometheus_client's text encoder writes every family afresh: 3-4 ms for kvwatch's ~140 series, every
tick (bench/bench_overhead.py), mostly escaping label values that have not changed. Its output is the
families' texts one after the other, so a family whose name, help, type and samples are those of the
previous render is given the text it had then; only the others are written by the encoder. The
OpenMetrics encoder ends its output with "# EOF", so it is not split: it renders whole as before.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

Encoder = Callable[[Collector], bytes]


class _One(Collector):
    """One family, as the encoder reads a registry."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return (self._family,)


def splits_by_family(encoder: Encoder) -> bool:
    """The plain text format (any name escaping): its output is its families' texts in turn."""
    func = encoder.func if isinstance(encoder, functools.partial) else encoder
    return func is generate_latest


def _key(family: Metric) -> tuple[object, ...]:
    """Everything of a family the text format writes (exemplars and native histograms it omits)."""
    return (family.type, family.documentation, family.unit,
            tuple((s.name, tuple(s.labels.items()), _value(s.value), s.timestamp) for s in family.samples))


def _value(value: float) -> object:
    """A sample's value as its key: equal numbers are written alike (repr), but for the zeros (0.0 and
    -0.0 are equal, written "0.0" and "-0.0"); NaN is equal to nothing, so never reused."""
    return value if value else repr(value)


class FamilyMemo:
    """Renders a registry with an encoder, reusing the last render's text of every unchanged family.
    Holds one render's texts per name escaping (bounded by the series of one scrape)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # family name -> (its key, its text), for the last render in each name escaping
        self._last: dict[object, dict[str, tuple[tuple[object, ...], bytes]]] = {}

    def render(self, encoder: Encoder, registry: Collector) -> bytes:
        if not splits_by_family(encoder):
            return encoder(registry)
        escaping = encoder.keywords.get("escaping") if isinstance(encoder, functools.partial) else None
        parts = []
        with self._lock:   # a scrape and the watch loop may render at once: one at a time
            last = self._last.get(escaping, {})
            now: dict[str, tuple[tuple[object, ...], bytes]] = {}
            for family in registry.collect():
                key = _key(family)
                kept = last.get(family.name)   # compared, not hashed: a key holds every sample
                text = kept[1] if kept is not None and kept[0] == key else encoder(_One(family))
                now.setdefault(family.name, (key, text))
                parts.append(text)
            self._last[escaping] = now
        return b"".join(parts)
