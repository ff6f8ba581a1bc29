"""kvwatch/boundary/sample_lines.py reads vLLM's plain sample lines exactly as prometheus_client's
parser does, and hands any other line back to that parser (None)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.boundary import engine_http
from kvwatch.boundary.sample_lines import plain_samples

METRICS = Path(__file__).parent / "fixtures" / "metrics"
PAGES = sorted(METRICS.glob("*.txt"))


def by_client(text: str, wanted: set[str] | tuple[str, ...]) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return found


def same(a: dict[str, list[tuple[dict[str, str], float]]], b: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
    """Equal, NaN included (NaN != NaN as a float)."""
    return repr(a) == repr(b)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_lines_kvwatch_keeps_of_each_captured_page_read_as_the_parser_reads_them(page: Path) -> None:
    kept = engine_http._kept_lines(page.read_bytes()).decode()
    assert kept, f"{page.name}: no line kvwatch reads"
    plain = plain_samples(kept, engine_http._WANTED)
    assert plain is not None, f"{page.name}: a line vLLM wrote is not plain"
    assert same(plain, by_client(kept, engine_http._WANTED))
    assert {engine_http.KV_USAGE, engine_http.CACHE_CONFIG} <= set(plain)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_reads_the_same_through_either_parser(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = engine_http.parse_page(page.read_bytes())
    monkeypatch.setattr(engine_http, "plain_samples", lambda text, wanted: None)
    assert repr(fast) == repr(engine_http.parse_page(page.read_bytes()))


_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
_label_names = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True)
_label_values = st.text(st.sampled_from(['a', 'Z', '0', ' ', ',', '}', '{', '=', '"', '\\', '\n', '\r', 'é', '#']),
                        max_size=12)
_values = st.one_of(st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=True).map(repr),
                    st.sampled_from(["+Inf", "-Inf", "NaN", "1e3", ".5", "5.", "-0.0", "+7"]))


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@given(st.lists(st.tuples(_names, st.dictionaries(_label_names, _label_values, max_size=4), _values), max_size=6))
def test_any_plain_line_reads_as_the_parser_reads_it(lines: list[tuple[str, dict[str, str], str]]) -> None:
    text = "\n".join(name + ("{" + ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items()) + "}" if labels else "")
                     + f" {value.replace('inf', 'Inf').replace('nan', 'NaN')}" for name, labels, value in lines)
    wanted = {name for name, _, _ in lines}
    plain = plain_samples(text, wanted)
    assert plain is not None, text
    assert same(plain, by_client(text, wanted))


@pytest.mark.parametrize("line", [
    'vllm:x{engine="0"} 1 1700000000000',        # a timestamp
    'vllm:x{engine="0"}  1',                      # two spaces
    'vllm:x{engine="0",} 1',                      # a trailing comma
    'vllm:x{engine="0",engine="1"} 1',            # a repeated label: the parser refuses it
    'vllm:x{__name__="y"} 1',                     # a reserved label name
    'vllm:x{"engine"="0"} 1',                     # a quoted label name
    'vllm:x{engine="0"} 1_000',                   # a digit group: the parser refuses it, float() would not
    ' vllm:x 1',                                  # leading space
    'vllm:x{engine="0\\t"} 1',                    # an escape the format lacks
    'vllm:x{engine="0"} 0x10',
])
def test_a_line_in_another_form_goes_to_the_parser(line: str) -> None:
    assert plain_samples(line, {"vllm:x"}) is None
