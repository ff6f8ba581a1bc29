"""Logs as they arrive, repaired before matching (pure): one block of text in, vLLM's own lines out.

A log reaches kvwatch through whatever ran the engine and whoever pasted it: a CI runner's viewer,
`docker compose`, `kubectl logs --prefix`, journald, a launcher that logs the engine's stderr as
its own records, a Markdown quote, a terminal that wrapped it, a web page that reflowed it. In order:
- CRLF line ends and ANSI colours go, and a colour whose escape the paste lost (`[0;36m`);
- the tools' per-line prefixes are taken off by their shape (prefixes.py): a run of shapes that
  starts enough lines of an evenly spread sample of the block is stripped from every line, and a
  block indented as a whole loses the indentation its lines share;
- broken lines are joined (rejoin.py): where a line was cut at the width its neighbours were
  printed at (or inside one of vLLM's words) and the next starts no record of its own, and where a
  call's arguments or a pydantic sentence were reflowed one per line.
A log pasted as one line (its newlines lost) is cut where vLLM's records start again (split_pasted).

Everything here runs on blocks of about a megabyte (diagnose.py's batches).
"""
from __future__ import annotations

import re

from kvwatch.diagnosis import placement_wait, prefixes, rejoin
from kvwatch.diagnosis.patterns import PATTERNS, ROOT_KEYWORDS
from kvwatch.diagnosis.refusals import REFUSALS
from kvwatch.vllm_releases.texts import TEXTS

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# A colour whose escape character the paste lost ("[0;36m", "#033[1;36m"): only the shapes vLLM's
# colour prefixes take, so a bracketed number of a message is never one.
ANSI_RESIDUE = re.compile(r"(?:#033)?\[(?:0;0|[01];3\d)m")
_RESIDUE_HINTS = ("[0;", "[1;")       # vLLM's process colour and its reset
_SAMPLE_LINES = 64
# Where a record starts again inside a pasted line: a vLLM process prefix or a level with its timestamp.
_EMBEDDED_RECORD = re.compile(r"(?<=\S)\s*(?=\((?:APIServer|EngineCore\w*|Worker\w*|VllmWorker\w*|RayWorkerWrapper"
                              r"|DPEngineCoreActor)(?: rank=\d+)?(?:, ip=[\d.]+)? pid=\d+\))"
                              r"|(?<=\S) (?=(?:ERROR|WARNING|INFO|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d )")
_ONLY_PROCESS = re.compile(r"^\s*(?:\([A-Za-z_][\w.-]*(?: rank=\d+)?(?:, ip=[\d.]+)? pid=\d+\)\s*)+$")
PASTED_LINE_CHARS = 400     # a line longer than this may be a whole pasted log
# Words vLLM's messages take from its code, not their templates: the attention selector's reasons
# ("sparse not supported", "compute capability not supported"), triton's resources, NCCL's errors,
# torch's OOM message.
_GENERATED_WORDS = ("head_size", "dtype", "kv_cache_dtype", "block_size", "sparse", "sink", "setting", "compute",
                    "capability", "causal", "non", "attention", "partial", "multimodal", "prefix", "shared", "memory",
                    "registers", "supported", "not",
                    # NCCL's error strings (ncclGetErrorString)
                    "unhandled", "cuda", "system", "internal", "invalid", "argument", "usage", "remote", "process",
                    "exited", "network", "error",
                    # torch's CUDA OOM message, whose figures the facts read
                    "Tried", "to", "allocate", "has", "a", "total", "capacity", "of", "which", "is", "free",
                    "Process", "memory", "in", "use")
# The words of vLLM's messages, where a word a terminal split is rejoined without a space.
WORDS = rejoin.vocabulary([p.regex.pattern for p in PATTERNS] + [r.regex.pattern for r in REFUSALS]
                          + list(ROOT_KEYWORDS)
                          + [t.template for texts in TEXTS.values() for t in texts] + list(_GENERATED_WORDS)
                          + [placement_wait.WAIT_TEXT])


def _sample(lines: list[str]) -> list[str]:
    """About _SAMPLE_LINES lines spread evenly over the block."""
    step = max(1, len(lines) // _SAMPLE_LINES)
    return lines[::step]


def normalise(text: str) -> str:
    """A block of whole lines as vLLM printed them: colours and prefixes off, broken lines joined."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x1b" in text:
        text = ANSI.sub("", text)
    lines = text.split("\n")
    lengths = list(map(len, lines))       # a lost escape's residue was printed: it takes width
    if any(r in text for r in _RESIDUE_HINTS) and ANSI_RESIDUE.search(text):
        text = ANSI_RESIDUE.sub("", text)
        lines = text.split("\n")
    accepted = prefixes.common_prefixes(_sample(lines))
    if accepted:
        lines = prefixes.stripper(accepted).sub("", text).split("\n")
    lines = prefixes.dedent(lines)
    return "\n".join(rejoin.rejoin(lines, WORDS, lengths))


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
