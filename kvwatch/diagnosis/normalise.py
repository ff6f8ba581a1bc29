"""Logs as they arrive: what the tools that run vLLM add to its lines, taken off before matching (pure).

A log reaches kvwatch through whatever ran the engine: a CI runner's viewer, `docker compose`,
`kubectl logs --prefix`, journald, a launcher that logs the engine's stderr as its own records. Each
puts the same kind of prefix before every line, so one block of text is looked at once: the
prefixes found on a sample of its first lines are stripped from every line of the block (a prefix
seen on one line in a hundred is left alone). Lines a terminal wrapped at its width are joined, and
a log pasted as one line (its newlines lost) is cut where vLLM's records start again.

Everything here runs on blocks of about a megabyte (diagnose.py's batches); on a plain vLLM log
it costs one look at the first lines of a block.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Prefix:
    name: str
    regex: re.Pattern[str]      # anchored at a line's start (re.M)
    source: str                 # who writes it, and a public log that shows it


def _prefix(name: str, regex: str, source: str) -> Prefix:
    return Prefix(name, re.compile(r"^" + regex, re.M), source)


# The more specific first where one could hide another (TorchServe's before a bare timestamp); kubectl's
# prefix before a timestamp is taken in two steps.
PREFIXES: tuple[Prefix, ...] = (
    _prefix("kubectl_prefix", r"\[pod/[^/\]\s]+/[^\]\s]+\] ",
            "kubectl logs --prefix: '[pod/NAME/CONTAINER] ' before each line"),
    _prefix("torchserve", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d+ \[\w+ ?\] [\w.-]+ MODEL_LOG - ",
            "TorchServe's worker log: '2024-11-18T16:43:45,496 [INFO ] W-9000-model_1.0-stdout MODEL_LOG - ' "
            "(pytorch/serve#3365)"),
    _prefix("iso_timestamp", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? ",
            "docker logs -t, kubectl logs --timestamps, cloud log exports (OpenRLHF/OpenRLHF#336)"),
    _prefix("launcher_record", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+ \[\w+\] \([\w .-]+\) ",
            "a launcher logging the engine's stderr: '2026-06-09 14:01:52.982 [Error] (Process) ' "
            "(lemonade-sdk/vllm-rocm#5)"),
    _prefix("python_logging", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - [\w.]+ - [A-Z]+ - ",
            "a Python wrapper logging the engine's output: '2025-08-13 04:39:39,838 - __main__ - INFO - ' "
            "(chatdoc-com/OCRFlux#70)"),
    _prefix("journald", r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]+ [\w@.-]+(?:\[\d+\])?: ",
            "journalctl's default (short) output: 'Mon DD HH:MM:SS host unit[pid]: '"),
    _prefix("docker_compose", r"[A-Za-z0-9][\w.-]*(?:-\d+)?\s+\| ",
            "docker compose up/logs: 'service-1  | ' (vllm-project/vllm#10439, #3435)"),
    _prefix("ci_runner", r" {1,2}\| ",
            "a CI runner's log viewer copied from the browser (Buildkite): '  | ' (vllm-project/vllm-omni#946)"),
)

_SAMPLE_LINES = 64
_MIN_SHARE = 0.25           # a prefix counts when it starts at least this share of the sampled lines
_WRAP_MIN_WIDTH = 60        # a terminal narrower than this is not taken for one
_WRAP_MIN_LINES = 4
# A record of its own: a wrapped line never continues into one of these.
_RECORD_HEAD = re.compile(r"(?:\([A-Za-z_][\w.-]*(?: rank=\d+)?(?:, ip=[\d.]+)? pid=\d+\)|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)"
                          r"[ :]|Traceback \(|\[rank\d+\]:|  File \")")
# Where a record starts again inside a pasted line: a vLLM process prefix or a level with its timestamp.
_EMBEDDED_RECORD = re.compile(r"(?<=\S)\s*(?=\((?:APIServer|EngineCore\w*|Worker\w*|VllmWorker\w*|RayWorkerWrapper"
                              r"|DPEngineCoreActor)(?: rank=\d+)?(?:, ip=[\d.]+)? pid=\d+\))"
                              r"|(?<=\S) (?=(?:ERROR|WARNING|INFO|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d )")
_ONLY_PROCESS = re.compile(r"^\s*(?:\([A-Za-z_][\w.-]*(?: rank=\d+)?(?:, ip=[\d.]+)? pid=\d+\)\s*)+$")
# A traceback frame line as Python prints it, whole: it ends where Python ends it, never wrapped on.
_WHOLE_FRAME = re.compile(r'\s*File "[^"]*", line \d+, in \S+$')
PASTED_LINE_CHARS = 400     # a line longer than this may be a whole pasted log


def _sample(text: str) -> list[str]:
    end = 0
    for _ in range(_SAMPLE_LINES):
        nl = text.find("\n", end)
        if nl == -1:
            end = len(text)
            break
        end = nl + 1
    return text[:end].splitlines()


def prefixes_in(lines: list[str]) -> list[Prefix]:
    """The tools' prefixes that start enough of these lines (after the ones before them are taken off)."""
    found: list[Prefix] = []
    if not lines:
        return found
    need = max(1, int(len(lines) * _MIN_SHARE))
    for prefix in PREFIXES:
        hits = [i for i, line in enumerate(lines) if prefix.regex.match(line)]
        if len(hits) >= need:
            found.append(prefix)
            lines = [prefix.regex.sub("", line, count=1) for line in lines]
    return found


def wrap_width(lines: list[str]) -> int | None:
    """The width a terminal wrapped these lines at: a length many different long lines share exactly
    (a line printed again, such as one access-log line, or a whole traceback frame line, complete as
    printed whatever its length, is no evidence of a width)."""
    counts: dict[int, int] = {}
    for line in dict.fromkeys(lines):
        if len(line) >= _WRAP_MIN_WIDTH and not _WHOLE_FRAME.match(line):
            counts[len(line)] = counts.get(len(line), 0) + 1
    if not counts:
        return None
    width, n = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    if n >= _WRAP_MIN_LINES and n * 5 >= len(lines) and n * 2 > sum(counts.values()):
        return width
    return None


def _join_wrapped(text: str, width: int) -> str:
    pattern = re.compile(r"^(.{" + str(width) + r"})\n(?!\n)", re.M)

    def join(m: re.Match[str]) -> str:
        nxt = m.end()
        return m[1] if not _RECORD_HEAD.match(text, nxt) and not _WHOLE_FRAME.match(m[1]) else m[0]
    return pattern.sub(join, text)


def normalise(text: str) -> str:
    """A block of whole lines as vLLM printed them: the tools' prefixes off, wrapped lines joined."""
    sample = _sample(text)
    for prefix in prefixes_in(sample):
        text = prefix.regex.sub("", text)
        sample = [prefix.regex.sub("", line, count=1) for line in sample]
    width = wrap_width(sample)
    if width is not None:
        text = _join_wrapped(text, width)
    return text


def split_pasted(line: str) -> list[str]:
    """A long line cut where vLLM's records start again (a log pasted without its newlines)."""
    if len(line) <= PASTED_LINE_CHARS:
        return [line]
    parts = [p for p in _EMBEDDED_RECORD.split(line) if p.strip()]
    if len(parts) <= 1:
        return [line]
    out: list[str] = []
    for part in parts:
        if out and _ONLY_PROCESS.match(out[-1]):
            out[-1] = out[-1] + " " + part.lstrip()     # a process prefix belongs to the record after it
        else:
            out.append(part)
    return out
