"""The per-line prefixes that the tools running vLLM put before its lines, found by their shape (pure).

A prefix is a run of a few shapes of token at a line's start: a timestamp, a bracketed tag
(`[pod/x/c] `, `[rank0]: `, `[Error] `), a name and a pipe (`svc-1  | `, Buildkite's `  | `),
a Markdown quote (`> `), a parenthesised tag (`(Process) `), and after a timestamp a syslog
host and unit (`host vllm[123]: `) or logging's dashed fields (` - __main__ - INFO - `).
No product is named: a tool's prefix is whatever run of these shapes starts enough of a block's
lines. vLLM's own heads are never a prefix: its process tag `(EngineCore_DP0 pid=7)` holds an
`=` no tag shape takes, and its level record starts with a word no shape starts with.

NVIDIA NIM's logger writes vLLM's records in V0's own head with hundredths of a second (`WARNING
10-15 12:41:23.21 caches.py:27] `): a level record as vLLM's, no prefix to take off.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_DATE_TIME = (r"(?:\d{4}[-/]\d\d[-/]\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z| ?[+-]\d\d:?\d\d| ?UTC)?"
              r"|[A-Z][a-z]{2} [ \d]\d,? (?:\d{4} )?\d\d:\d\d:\d\d(?:[.,]\d+)?"
              r"|\d\d:\d\d:\d\d(?:[.,]\d+)?)")


@dataclass(frozen=True)
class Shape:
    name: str
    regex: re.Pattern[str]
    after_timestamp: bool = False     # only right after a timestamp (its words are too common alone)
    example: str = ""


SHAPES: tuple[Shape, ...] = (
    Shape("timestamp", re.compile(r"\[" + _DATE_TIME + r"\]:?(?: |(?=\[))|" + _DATE_TIME + r":? "),
          example="2024-06-28T06:11:52.685300953Z "),
    Shape("bracket_tag", re.compile(r"\[[^\]\s='\"]{1,120}\]:?(?: |(?=\[))"), example="[pod/vllm-0/vllm] "),
    Shape("level_tag", re.compile(r"\[ ?[A-Za-z]{3,8} ?\] "), example="[INFO ] "),
    Shape("name_pipe", re.compile(r"[A-Za-z0-9][\w.-]*\s+\| ?"), example="vllm-1  | "),
    Shape("pipe", re.compile(r" {0,3}\| ?"), example="  | "),
    Shape("quote", re.compile(r"> ?"), example="> "),
    Shape("paren_tag", re.compile(r"\([A-Za-z][\w .-]{0,59}\) "), example="(Process) "),
    Shape("host_unit", re.compile(r"[\w.-]+ [\w@./-]+(?:\[\d+\])?: "), after_timestamp=True,
          example="gpu-host-3 vllm.service[4242]: "),
    Shape("dashed_fields", re.compile(r"(?:[\w.-]+ ){0,2}- (?:[\w.]+ - ){0,2}"), after_timestamp=True,
          example="- __main__ - INFO - "),
)
_MAX_TOKENS = 6
_MIN_SHARE = 0.25       # a prefix counts when it starts at least this share of a block's non-blank lines


def _tokens(line: str) -> list[tuple[str, int]]:
    """The shapes at the start of `line`, in order, each with the offset where it ends."""
    out: list[tuple[str, int]] = []
    at = 0
    previous = ""
    while len(out) < _MAX_TOKENS:
        for shape in SHAPES:
            if shape.after_timestamp and previous not in ("timestamp", "level_tag"):
                continue
            m = shape.regex.match(line, at)
            if m is not None and m.end() > at:
                out.append((shape.name, m.end()))
                at, previous = m.end(), shape.name
                break
        else:
            break
    return out


def signature(line: str) -> tuple[str, ...]:
    """The shapes that start `line`: its prefix as a sequence of token kinds."""
    return tuple(name for name, _ in _tokens(line))


def common_prefixes(lines: Sequence[str]) -> frozenset[tuple[str, ...]]:
    """The prefix signatures (and every start of them) that start enough of these lines."""
    counts: Counter[tuple[str, ...]] = Counter()
    seen = 0
    for line in lines:
        if not line.strip():
            continue
        seen += 1
        sig = signature(line)
        for n in range(1, len(sig) + 1):
            counts[sig[:n]] += 1
    need = max(1, int(seen * _MIN_SHARE))
    return frozenset(sig for sig, n in counts.items() if n >= need)


_BY_NAME = {shape.name: shape for shape in SHAPES}


def stripper(accepted: frozenset[tuple[str, ...]]) -> re.Pattern[str]:
    """One regex that takes the longest accepted prefix off each line of a text (re.M): one pass
    of the text, not a walk of the shapes per line."""
    runs = sorted(accepted, key=len, reverse=True)
    alternatives = ["".join(f"(?:{_BY_NAME[name].regex.pattern})" for name in run) for run in runs]
    return re.compile(r"^(?:" + "|".join(alternatives) + ")", re.M)


def strip_line(line: str, accepted: frozenset[tuple[str, ...]]) -> str:
    """`line` without the longest accepted prefix that starts it."""
    return stripper(accepted).sub("", line, count=1)


def dedent(lines: list[str]) -> list[str]:
    """A block indented as a whole (a quote in an issue's body) without the indentation all its lines
    share; a lone line keeps its own (pydantic's indented sentence is read by its indentation)."""
    if any(line[:1] not in (" ", "") and line.strip() for line in lines):
        return lines                # a line at the margin: nothing is indented as a whole (the usual case)
    body = [line for line in lines if line.strip()]
    if len(body) < 2:
        return lines
    indent = min(len(line) - len(line.lstrip(" ")) for line in body)
    return [line[indent:] for line in lines] if indent else lines
