"""Lines that pasting broke, joined again (pure).

A message reaches an issue broken where a terminal wrapped it (at a fixed width, even mid-word),
where a web page reflowed it (at spaces), or where a user cut it by hand. A line was broken by a
width when the next line's first word would not have fitted on it, at the width its neighbourhood
was printed at (the longest line around); it continues the line before when it also starts no
record of its own (no level, process tag, traceback or exception head, tool prefix, indented code)
and, unless its neighbours show a wrap, the line before did not end its sentence. The join inserts
a space unless the break was inside a token: a terminal's cut at its width, a number's digits, a
word of vLLM's messages split in two (`KV cach` / `e`), a path, a keyword's value, an enum's member.
Two reflows are joined whatever the width: a call's arguments one per line, and the rest of a
pydantic sentence before its `[type=...]`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kvwatch.diagnosis.prefixes import signature

# A line that starts a record: never a continuation. A superset of what diagnose.py reads as a
# record's start, so a join never moves a line from one record to another.
RECORD_HEAD = re.compile(
    r"\s*(?:\([\w .=-]*?pid=\d+[^)]*\)"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)(?::|\s+\d\d-\d\d\s)"
    r"|Traceback \(|During handling of|The above exception|File \"|\[rank\d+\]:"
    r"|(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Resources|Warning|Exit)\b"
    r"|Process [\w-]+:|\^+\s*$|#|\[[^\]\s'\"]+\](?::|\s)|\[[A-Z]\d{4} \d|\||\+[-=]|[-=*~]{3}|(?:/|[A-Za-z]:\\)\S*:\d+: )")
# A traceback frame line as Python prints it, whole: it ends where Python ends it.
WHOLE_FRAME = re.compile(r'\s*File "[^"]*", line \d+, in \S+$')
# Lines after which pydantic starts a line of its own (the field's name, the next error).
_PYDANTIC_END = re.compile(r"validation errors? for \w+(?:Config|Args|Params)\s*$|^\s*For further information visit|\[type=\w+[^\]]*\]\s*$")
_NEW_SENTENCE = re.compile(r"[A-Z][a-z]+\b(?![-_./:(\[])")
_DEVICE_END = re.compile(r"\b(?:cuda|hip|xpu|npu|rocm|mps|cpu|gpu):$")
_DOTTED_END = re.compile(r"[\w/]*[._/][\w/]*\.$")      # a module or a path, before its next part
_THOUSANDS = re.compile(r"\d{3}(?![\d.])")
_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]+\b")
_UNIT = re.compile(r"(?:[KMGT]i?B|B|GB/s|GPUs?|CPUs?|ms|s)\b")
_NUMBER = re.compile(r"(?:\d\d+|\d+\.\d+)(?=[\s,;:)\]}'\".]|$)")
_SENTENCE_END = re.compile(r"[.!?]\s*$")
_WORD_AT_END = re.compile(r"([A-Za-z]+)$")
_WORD_AT_START = re.compile(r"^([A-Za-z]+)")
_FIRST_TOKEN = re.compile(r"\s*\S*")
_OPENERS = frozenset("([{,")
_PYDANTIC_OPEN = re.compile(r"\s*(?:Value error, |Input should |Assertion failed, )")
# A source line a traceback echoes: its arguments are code, not a message reflowed
_CODE = re.compile(r"\s+(?:raise |return |\w+ = |[\w.]+\()")
# The start of a line that may continue the one before: not a blank line, a process tag, an indented
# line (one space is a terminal's cut at a space), a tab, a comment or a table.
_MAY_CONTINUE = re.compile(r"\n(?:(?!(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)[: ])"
                           r"(?=[^\n\t#|( ]|\((?![\w .=-]*?pid=\d)| (?! ))"
                           r"|(?<=[(\[{,]\n)(?= +[\w'\"\]})]))")          # or an argument of a call reflowed
_WINDOW = 64
_WORD = 12                # a wrapped line ends within about a word of its width
_WRAPPED_LINES = 3        # lines that near the width, the longest included: the width was a wrap's
MIN_WIDTH = 48            # a terminal or page of 60 (less a word) or more: narrower lines are not a wrap
_GLUE_AFTER = frozenset("/(_[")
_GLUE_BEFORE = frozenset(")]},.:;/=")


def vocabulary(texts: Iterable[str]) -> frozenset[str]:
    """The words of vLLM's messages as they are written, and in lower case: where a split word's
    halves are rejoined ("EngineCore" is a word, "Enginecore" is not)."""
    found = [w for text in texts for w in re.findall(r"[A-Za-z]{2,}", text)] + ["a", "A"]
    return frozenset(found + [w.lower() for w in found])


def reflowed(previous: str, line: str) -> bool:
    """Whether `line` is the next argument of a call or a literal that a pretty-printer or a user
    put one per line (`AttentionSelectorConfig(` / `    head_size=576,`), or the rest of a pydantic
    error's sentence reflowed before its `[type=...]`."""
    if _PYDANTIC_OPEN.match(previous) and "[type=" not in previous:
        return bool(line.strip()) and not line.startswith("  ") and not RECORD_HEAD.match(line)
    return previous[-1:] in _OPENERS and line[:1] == " " and line.strip()[:1] not in ("", "^") \
        and not RECORD_HEAD.match(line) and not WHOLE_FRAME.match(previous) \
        and not _CODE.match(previous)


def continues(previous: str, line: str, wrapped: bool = False) -> bool:
    """Whether `line` continues `previous` (neither a record of its own nor after a finished one).
    `wrapped`: the lines around were broken at one width, so a sentence may go on past a capital."""
    if not previous.strip() or not line.strip() or previous.startswith("#") or line.startswith(("  ", "\t")):
        return False
    if RECORD_HEAD.match(line) or WHOLE_FRAME.match(previous) or _PYDANTIC_END.search(previous[-200:]):
        return False
    if signature(line)[:1] not in ((), ("paren_tag",), ("quote",)):
        return False            # a tool's prefix left on it (a block too small to tell): its own line
    if wrapped or previous[-1:].isspace() or line[:1] == " ":
        return True             # a space at the break: a terminal's cut inside a sentence
    if previous[-1:].isdigit() and _UNIT.match(line):
        return True             # a number's unit
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
    if a == "." and _CONSTANT.match(line) and previous[-2:-1].isalpha():
        return ""                  # an enum's member (AttentionBackendEnum.CUTLASS_MLA)
    if a == "=" and previous[-2:-1].isalnum():
        return ""                  # a keyword's value (head_size=576)
    dotted = a == "." and b.islower() and (at_width or _DOTTED_END.search(previous) is not None)
    if a in _GLUE_AFTER or dotted or (a == "." and b.isdigit() and previous[-2:-1].isdigit()) \
            or (a == ":" and b.isdigit() and _DEVICE_END.search(previous)):
        return ""                # inside a path, a call, a number, a device (cuda:0), a file (config.json)
    if a == "-" and b.isalnum() and previous[-2:-1].isalnum():
        return ""                                  # a hyphenated word, broken at its hyphen
    if b == "_":
        return "" if at_width else " "         # a name cut at its underscore, or "in _execute"
    if a == "," and previous[-2:-1].isdigit() and _THOUSANDS.match(line):
        return ""                  # a number's thousands (679,808)
    if b in _GLUE_BEFORE or line.startswith("'s ") or (b == "-" and a.isalnum() and line[1:2].isalnum()):
        return ""
    if b in "'\"" and a.isalnum() and line[1:2] in ("", " ", ",", ".", ":", ";", ")", "]", "}"):
        return ""                  # a closing quote
    if a in "'\"" and previous[-2:-1] in (" ", "(", "[", "{", ""):
        return ""                  # an opening one
    if a == "'" and b.isalpha() and previous[-2:-1].isalpha():
        return ""                  # an apostrophe (the model's)
    left, right = _WORD_AT_END.search(previous[-64:]), _WORD_AT_START.match(line)
    if left and right and previous.endswith("'s"):
        return " "                 # a possessive ends its word (the models's)
    if left and right:
        joined = left[1] + right[1]
        both = left[1] in words and right[1] in words
        if at_width and (_CONSTANT.fullmatch(left[1]) and right[1].islower() and len(right[1]) > 1
                         or left[1].islower() and left[1] in words and b.isupper()):
            return " "                 # a constant then a word (CUTLASS_MLA is), a word then a name (and Blackwell)
        if at_width:               # a terminal cuts inside words: a space only between two of vLLM's
            config = right[1] in ("Config", "Args")          # a pydantic class: VllmConfig
            return " " if both and joined not in words and not config else ""
        if joined in words and not both:
            return ""
    elif at_width and a.isdigit() and _UNIT.match(line):
        return " "                 # a number and its unit: a cut there kept their space on one side
    elif at_width and left and len(left[1]) > 1 and _NUMBER.match(line):
        return " "                 # a word and a number of its own ("within 1800 seconds"), not "Qwen2"
    elif at_width and a.isdigit() and right and right[1] in words:
        return " "                 # an identifier's number, then a word ("EngineCore_DP0 died")
    return "" if at_width and a.isalnum() and b.isalnum() else " "


@dataclass(frozen=True)
class Width:
    """The width a neighbourhood of lines was printed at, and how it was broken there."""
    width: int
    wrapped: bool       # other lines end within a word of it: the width was a wrap's
    hard: bool          # most of those end exactly at it: a terminal's cut, inside words too


def split_word(previous: str, line: str, words: frozenset[str]) -> bool:
    """Whether the break fell inside one of vLLM's words ("KV cach" / "e is needed"), whatever the
    width: the halves make the word, and are not both words themselves."""
    left, right = _WORD_AT_END.search(previous[-64:]), _WORD_AT_START.match(line)
    if left is None or right is None:
        return False
    return left[1] + right[1] in words and not (left[1] in words and right[1] in words)


def width_around(lengths: list[int], i: int) -> Width:
    """The Width of line i's neighbourhood: the longest line within the _WINDOW lines around its own
    (a paste of several excerpts may hold several widths)."""
    c = i // _WINDOW
    around = lengths[max(0, c - 1) * _WINDOW:(c + 2) * _WINDOW]
    width = max(around, default=0)
    near = sum(1 for n in around if n >= width - _WORD)
    exact = around.count(width)
    return Width(width, near >= _WRAPPED_LINES or exact >= 2, exact >= 2 and exact * 5 >= near * 3)


def _candidates(lines: list[str]) -> list[int]:
    """The lines that may continue the one before: one pass of a regex over the block (most lines of
    a log start a record with a process tag, or an indentation, and are passed over at C speed)."""
    text = "\n".join(lines)
    out: list[int] = []
    index, at = 0, 0
    for m in _MAY_CONTINUE.finditer(text):
        index += text.count("\n", at, m.end())       # the line the match starts, counted at C speed
        at = m.end()
        out.append(index)
    return out


def rejoin(lines: list[str], words: frozenset[str], lengths: list[int] | None = None) -> list[str]:
    """The lines with each continuation joined onto the line it continues. `lengths`: each line's
    length as printed (before a tool's prefix came off), where the width it was broken at shows.
    A line was broken by its width when the next line's first word would not have fitted on it."""
    candidates = _candidates(lines)
    if not candidates:
        return lines
    lengths = lengths if lengths is not None else [len(line) for line in lines]
    widths: dict[int, Width] = {}       # per neighbourhood, computed for the lines that need it
    logical = list(lines)           # each line as joined so far (a chain's first line holds it)
    head = list(range(len(lines)))  # the line each one was joined into
    for i in candidates:
        line = lines[i]
        h = head[i - 1]
        prev = logical[h]
        at = widths.get(i // _WINDOW) or widths.setdefault(i // _WINDOW, width_around(lengths, i))
        printed = lengths[i - 1]
        broken = at.width >= MIN_WIDTH and printed + 1 + len(_FIRST_TOKEN.match(line)[0]) > at.width  # type: ignore[index]
        split = not broken and prev[-1:].isalpha() and line[:1].isalpha() and split_word(prev, line, words)
        if broken or split:
            # a terminal's cut; or, in a page's reflow, a word longer than the page cut at its width
            room = at.width - (printed - len(lines[i - 1]))          # the width less a tool's prefix
            longer = len(lines[i - 1].rsplit(" ", 1)[-1]) + len(line.split(" ", 1)[0]) > room
            at_width = broken and printed >= at.width and (at.hard or not at.wrapped or longer)
            # at the width with no space at the break: a cut inside a token, whatever follows
            inside = at_width and not prev[-1:].isspace() and not line[:1].isspace()
            if continues(prev, line, at.wrapped or inside):
                logical[h] = prev + separator(prev, line, words, at_width=at_width) + line
                head[i] = h
                continue
        if reflowed(prev, line):
            logical[h] = prev + ("" if prev[-1:] in "([{" or prev[-1:] == " " else " ") + line.strip()
            head[i] = h
    return [logical[i] for i in range(len(lines)) if head[i] == i]
