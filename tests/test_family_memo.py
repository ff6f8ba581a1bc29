"""kvwatch/exporter/family_memo.py: the text it serves is prometheus_client's, byte for byte, render
after render, while only the families that changed are written again."""
from __future__ import annotations

import functools
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector

from kvwatch.exporter import family_memo
from kvwatch.exporter.family_memo import FamilyMemo, splits_by_family


class Families(Collector):
    """A collector whose families the test sets before each render."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterable[Metric]:
        return list(self.families)


def gauge(name: str, values: dict[str, float], doc: str = "a gauge") -> Metric:
    family = GaugeMetricFamily(name, doc, labels=["gpu"])
    for gpu, value in values.items():
        family.add_metric([gpu], value)
    return family


def registry_with(source: Families) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(source)
    return registry


def test_each_render_is_the_encoders_and_only_changed_families_are_written_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    source, memo, written = Families(), FamilyMemo(), []
    registry = registry_with(source)

    def counting(collector: Collector) -> bytes:   # the text encoder, counting the families it writes
        written.extend(f.name for f in collector.collect())
        return generate_latest(collector)

    monkeypatch.setattr(family_memo, "generate_latest", counting)
    assert splits_by_family(functools.partial(counting, escaping="underscores"))
    counter = CounterMetricFamily("kvwatch_ticks", "ticks", value=3)
    info = InfoMetricFamily("kvwatch_build", "build", value={"version": 'a "quoted"\nvalue'})
    rounds = [
        ([gauge("kvwatch_a", {"0": 1.0, "1": 2.0}), gauge("kvwatch_b", {"0": 0.0}), counter, info],
         ["kvwatch_a", "kvwatch_b", "kvwatch_ticks", "kvwatch_build"]),
        # -0.0 equals 0.0 but is written "-0.0"
        ([gauge("kvwatch_a", {"0": 1.0, "1": 2.0}), gauge("kvwatch_b", {"0": -0.0}), counter, info], ["kvwatch_b"]),
        # new help text, and a NaN
        ([gauge("kvwatch_a", {"0": 1.0, "1": 2.0}, doc="new help"), gauge("kvwatch_b", {"0": float("nan")}), info],
         ["kvwatch_a", "kvwatch_b"]),
        # families in another order; NaN equals nothing, so it is written again, as are samples in another order
        ([gauge("kvwatch_b", {"0": float("nan")}), gauge("kvwatch_a", {"1": 2.0, "0": 1.0}, doc="new help")],
         ["kvwatch_b", "kvwatch_a"]),
        # the same again: nothing but the NaN is written
        ([gauge("kvwatch_b", {"0": float("nan")}), gauge("kvwatch_a", {"1": 2.0, "0": 1.0}, doc="new help")],
         ["kvwatch_b"]),
    ]
    for families, expected in rounds:
        source.families = families
        written.clear()
        served = memo.render(counting, registry)
        assert written == expected
        assert served == generate_latest(registry)
        assert served.decode().count("# TYPE") == len(families)


def test_openmetrics_renders_whole() -> None:
    source, memo = Families(), FamilyMemo()
    registry = registry_with(source)
    source.families = [gauge("kvwatch_a", {"0": 1.0}), gauge("kvwatch_b", {"0": 2.0})]
    served = memo.render(openmetrics_latest, registry)
    assert served == openmetrics_latest(registry)
    assert served.count(b"# EOF") == 1


_values = st.one_of(st.floats(allow_nan=True), st.integers(-10**6, 10**6), st.sampled_from([0.0, -0.0]))


@settings(max_examples=60)
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c"]),
                                st.dictionaries(st.sampled_from(["0", "1", 'x"\\\n']), _values, max_size=3),
                                max_size=3), min_size=1, max_size=5))
def test_any_sequence_of_renders_is_the_encoders(rounds: list[dict[str, dict[str, float]]]) -> None:
    source, memo = Families(), FamilyMemo()
    registry = registry_with(source)
    for families in rounds:
        source.families = [gauge(f"kvwatch_{name}", values) for name, values in families.items()]
        assert memo.render(generate_latest, registry) == generate_latest(registry)
