"""Lines that pasting broke, joined again (pure).

A message reaches an issue broken where a terminal wrapped it (at a fixed width, even mid-word),
where a web page reflowed it (at spaces), or where a user cut it by hand. A line continues the one
before it when it starts no record of its own (no level, no process tag, no traceback or exception
head, no indented code) and the line before did not end its sentence. The join inserts a space
unless the break was inside a token: a terminal's width, two halves of a number, a word of vLLM's
messages split in two (`KV cach` / `e`), a break after `/`, `(`, `_`, `:` or before `)`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

# A line that starts a record: never a continuation. A superset of what diagnose.py reads as a
# record's start, so a join never moves a line from one record to another.
RECORD_HEAD = re.compile(
    r"\s*(?:\([\w .-]*?pid=\d+[^)]*\)"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)(?::|\s+\d\d-\d\d\s)"
    r"|Traceback \(|During handling of|The above exception|File \"|\[rank\d+\]:"
    r"|(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Resources|Warning|Exit)\b"
    r"|Process [\w-]+:|\^+\s*$|#|\[|\||\+[-=]|[-=*~]{3}|(?:/|[A-Za-z]:\\)\S*:\d+: )")
# A traceback frame line as Python prints it, whole: it ends where Python ends it.
WHOLE_FRAME = re.compile(r'\s*File "[^"]*", line \d+, in \S+$')
# Lines after which pydantic starts a line of its own (the field's name, the next error).
_PYDANTIC_END = re.compile(r"validation errors? for \w+\s*$|^\s*For further information visit|\[type=\w+")
_NEW_SENTENCE = re.compile(r"[A-Z][a-z]+\b(?![-_./:(\[])")
_SENTENCE_END = re.compile(r"[.!?]\s*$")
_WORD_AT_END = re.compile(r"([A-Za-z]+)$")
_WORD_AT_START = re.compile(r"^([A-Za-z]+)")
_FIRST_TOKEN = re.compile(r"\s*\S*")
_WINDOW = 64
MIN_WIDTH = 60            # a terminal or page narrower than this is not taken for one
_GLUE_AFTER = frozenset("/(_[=")
_GLUE_BEFORE = frozenset(")]},.:;/_=")


def vocabulary(texts: Iterable[str]) -> frozenset[str]:
    """The words of vLLM's messages (lower case): where a split word's halves are rejoined."""
    return frozenset(w.lower() for text in texts for w in re.findall(r"[A-Za-z]{2,}", text))


def continues(previous: str, line: str) -> bool:
    """Whether `line` continues `previous` (neither a record of its own nor after a finished one)."""
    if not previous.strip() or not line.strip() or RECORD_HEAD.match(line) or previous.startswith("#"):
        return False
    if line.startswith("  ") or line.startswith("\t") or WHOLE_FRAME.match(previous):
        return False
    if _PYDANTIC_END.search(previous):
        return False
    if _NEW_SENTENCE.match(line):
        return False            # a capitalised word starts a message of its own
    if line[:1].isupper() and not (previous[-1:].islower() or previous[-1:] in ",:("):
        return False            # an upper-case word after a number or a unit: a new message too
    # after a finished sentence only a lower-case word or a number's rest continues it
    return not _SENTENCE_END.search(previous) or line[:1].islower() or line[:1].isdigit()


def separator(previous: str, line: str, words: frozenset[str], at_width: bool = False) -> str:
    """What stood between the two halves of a broken line: a space, or nothing (a token cut). At a
    terminal's width a cut inside a word is the rule, and a space only between two of vLLM's words."""
    if previous[-1:].isspace() or line[:1].isspace():
        return ""
    a, b = previous[-1], line[0]
    if a.isdigit() and b.isdigit():
        return ""
    if a in _GLUE_AFTER or (a in ".:" and b.isdigit()):
        return ""                                  # inside a path, a call, a number, a device (cuda:0)
    if a == "-" and b.isalnum() and previous[-2:-1].isalnum():
        return ""                                  # a hyphenated word, broken at its hyphen
    if b in _GLUE_BEFORE or line.startswith("'s "):
        return ""
    left, right = _WORD_AT_END.search(previous), _WORD_AT_START.match(line)
    if left and right:
        joined = (left[1] + right[1]).lower()
        both = left[1].lower() in words and right[1].lower() in words
        if at_width:
            return " " if both and joined not in words else ""
        if joined in words and not both:
            return ""
    return " " if not at_width or not (left or right) or previous[-1:].isalnum() != line[:1].isalnum() else ""


def widths(lengths: list[int]) -> list[int]:
    """Per line, the width its neighbourhood was printed at: the longest line within _WINDOW lines
    (a paste of several excerpts may hold several widths)."""
    chunk_max = [max(lengths[i:i + _WINDOW], default=0) for i in range(0, len(lengths), _WINDOW)]
    out: list[int] = []
    for i in range(len(lengths)):
        c = i // _WINDOW
        out.append(max(chunk_max[max(0, c - 1):c + 2]))
    return out


def rejoin(lines: list[str], words: frozenset[str], lengths: list[int] | None = None) -> list[str]:
    """The lines with each continuation joined onto the line it continues. `lengths`: each line's
    length as printed (before a tool's prefix came off), where the width it was broken at shows.
    A line was broken by its width when the next line's first word would not have fitted on it."""
    lengths = lengths if lengths is not None else [len(line) for line in lines]
    width_at = widths(lengths)
    out: list[str] = []
    for i, line in enumerate(lines):
        if out and i > 0:
            width, printed = width_at[i], lengths[i - 1]
            first = _FIRST_TOKEN.match(line)
            broken = width >= MIN_WIDTH and printed + 1 + (len(first[0]) if first else 0) > width
            at_width = broken and printed >= width
            prev = out[-1]
            if broken and continues(prev, line):
                out[-1] = prev + separator(prev, line, words, at_width=at_width) + line
                continue
        out.append(line)
    return out
