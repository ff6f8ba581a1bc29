"""Every fixture log as people paste it keeps its class and its facts (kvwatch/diagnosis/normalise.py).

The variants: re-wrapped at a width of 60 to 200 (a terminal's hard cut, or a page's reflow at
spaces), under each prefix shape a tool puts before lines (before or after the wrap), with CRLF
line ends and ANSI colours, and cut at a random point after the line that names the failure.
The verdict on each variant must be the verdict on the log as printed: the same class, the same
facts (a log outside kvwatch's vocabulary stays unknown). Hypothesis draws the variants with a
fixed seed (derandomize), so CI runs the same bounded set every time; the grid of widths, wraps and three
prefixes is run whole for every log.
"""
from __future__ import annotations

import json
import textwrap
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.diagnosis import Diagnosis, FailureKind, diagnose

HERE = Path(__file__).resolve().parent / "fixtures"
FIELD = json.loads((HERE / "field_logs" / "index.json").read_text())["logs"]
LOGS = sorted([f"logs/{p.name}" for p in (HERE / "logs").glob("*.log")]
              + [f"field_logs/{e['file']}" for e in FIELD])
# One prefix of each shape (test_normalise.SAMPLES names the tool of each).
PREFIXES = ("[pod/vllm-0/vllm] ", "2024-06-28T06:11:52.685300953Z ", "2026-06-09 14:01:52.982 [Error] (Process) ",
            "2025-08-13 04:39:39,838 - __main__ - INFO - ", "Dec  5 14:01:52 host vllm[123]: ", "vllm-1  | ",
            "  | ", ">   | ", "> ", "[2026-04-20 10:56:24.647187][UC][I] ")
ANSI_ON, ANSI_OFF = "\x1b[1;36m", "\x1b[0m"
# Facts that say where a line was, not what it says (a prefix before the wrap moves the process tag).
_WHERE = frozenset({"pid", "process"})


@cache
def text_of(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8", errors="replace")


@cache
def verdict(name: str) -> Diagnosis:
    return diagnose(text_of(name).splitlines())


def hard_wrap(line: str, width: int) -> list[str]:
    return [line[i:i + width] for i in range(0, len(line), width)] or [""]


def page_wrap(line: str, width: int) -> list[str]:
    return textwrap.wrap(line, width, replace_whitespace=False, break_on_hyphens=False) or [""]


def variant(text: str, width: int, page: bool, prefix: str, prefix_first: bool, crlf_ansi: bool) -> str:
    out: list[str] = []
    for line in text.splitlines():
        if prefix_first:
            line = prefix + line
        pieces = page_wrap(line, width) if page else hard_wrap(line, width)
        if crlf_ansi:      # a colour as a terminal's capture holds it: the width counts only what shows
            pieces = [ANSI_ON + p[:1] + ANSI_OFF + p[1:] if p.strip() else p for p in pieces]
        out.extend(pieces if prefix_first else [prefix + p for p in pieces])
    return ("\r\n" if crlf_ansi else "\n").join(out)


@cache
def cut_verdict(name: str, at: float) -> Diagnosis:
    """The verdict on the cut log as printed: what a paste of it must keep (the facts of lines past
    the cut are gone from both)."""
    return diagnose(cut_after_evidence(name, at).splitlines())


def cut_after_evidence(name: str, at: float) -> str:
    """The log cut at a point after the end of the line that names its failure (`at` of the way on)."""
    text, evidence = text_of(name), verdict(name).evidence
    where = text.find(evidence) if evidence else -1
    if where == -1:
        return text
    end = text.find("\n", where)
    if end == -1:
        return text
    return text[:end + 1 + int((len(text) - end - 1) * at)]


def same(d: Diagnosis, want: Diagnosis) -> bool:
    if d.kind is not want.kind:
        return False
    if want.kind is FailureKind.UNKNOWN:
        return True
    keep = {k: v for k, v in want.facts.items() if k not in _WHERE}
    return {k: v for k, v in d.facts.items() if k not in _WHERE} == keep


_VARIANTS = settings(max_examples=120, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_VARIANTS
@given(name=st.sampled_from(LOGS), width=st.integers(60, 200), page=st.booleans(),
       prefix=st.sampled_from(("",) + PREFIXES), prefix_first=st.booleans(), crlf_ansi=st.booleans(),
       at=st.floats(0, 1))
def test_a_pasted_log_keeps_its_class_and_facts(name, width, page, prefix, prefix_first, crlf_ansi, at):
    assert cut_verdict(name, at).kind is verdict(name).kind          # the cut keeps the line that names it
    text = variant(cut_after_evidence(name, at), width, page, prefix, prefix_first, crlf_ansi)
    d = diagnose(text.split("\n"))
    assert same(d, cut_verdict(name, at)), (d.kind, d.facts, cut_verdict(name, at).facts)


WIDTHS = (60, 61, 66, 73, 80, 88, 97, 111, 120, 133, 147, 159, 177, 188, 199, 200)
GRID_PREFIXES = (("", False), ("vllm-1  | ", True), (">   | ", False))


@pytest.mark.parametrize("name", LOGS)
def test_every_log_at_every_width_wrapped_both_ways_under_three_prefixes(name):
    # the full grid, every log (bench/bench_pasted_logs.py prints the same count): 96 variants a log
    want = cut_verdict(name, 0.0)
    for width in WIDTHS:
        for page in (False, True):
            for prefix, first in GRID_PREFIXES:
                text = variant(cut_after_evidence(name, 0.0), width, page, prefix, first, False)
                d = diagnose(text.split("\n"))
                assert same(d, want), (width, page, prefix, d.kind, d.facts, want.facts)
