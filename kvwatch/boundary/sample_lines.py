"""Prometheus sample lines in the one plain form vLLM writes them, read with a regex each (pure).

prometheus_client's text parser reads a character at a time: 3 ms for the ~40 lines kvwatch keeps of
a vLLM page, every tick of every engine (bench/bench_overhead.py). vLLM writes each sample as
`name{label="value",...} value`; such lines are read here. A line in any other form (a timestamp,
extra spaces, a trailing comma, a reserved or repeated label name) makes `plain_samples` answer None,
and the caller parses the text with prometheus_client as before: the plain form is a subset of what
that parser reads, and is read alike (tests/test_sample_lines.py compares the two).
"""
from __future__ import annotations

import re
from collections.abc import Collection

# prometheus_client's legacy names; a label name starting with "__" is reserved (its parser refuses it).
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"
# Runs of plain characters between escapes (\\, \n, \"): twice as fast as a choice per character.
_LABEL_VALUE = r'[^"\\\n]*(?:\\[\\n"][^"\\\n]*)*'
_LABEL = rf'{_LABEL_NAME}="{_LABEL_VALUE}"'
# Values Python's float() reads as the parser does (it tries int(), then float()); no "_" digit groups.
_VALUE = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN"
_LINE = re.compile(rf"({_NAME})(?:\{{({_LABEL}(?:,{_LABEL})*)\}})? ({_VALUE})")
_LABELS = re.compile(rf'({_LABEL_NAME})="({_LABEL_VALUE})"')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}

Samples = dict[str, list[tuple[dict[str, str], float]]]


def plain_samples(text: str, wanted: Collection[str]) -> Samples | None:
    """The samples of `text` (lines joined by "\\n") whose name is in `wanted`, by name in page
    order, each as (labels, value); None when a non-empty line is not in the plain form."""
    samples: Samples = {}
    for line in text.split("\n"):
        if not line:
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            return None
        name, label_text, value = match.groups()
        labels: dict[str, str] = {}
        if label_text:
            pairs = _LABELS.findall(label_text)
            labels = {key: _unescape(raw) for key, raw in pairs}
            if len(labels) != len(pairs):   # a repeated label: the parser refuses the line
                return None
        if name in wanted:
            samples.setdefault(name, []).append((labels, float(value)))
    return samples


def _unescape(raw: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], raw) if "\\" in raw else raw
