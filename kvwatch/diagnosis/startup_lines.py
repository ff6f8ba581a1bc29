"""The engine's startup lines about its KV cache (docs/vllm-facts.md §5), parsed in one place. Pure.

vLLM logs "Available KV cache memory: X GiB" (each worker) and then "GPU KV cache size: N tokens"
("CPU KV cache size" on the CPU backend). The output pump reads them while the engine starts
(kvwatch_kv_actual_bytes' cross-check) and the diagnosis reads them from a failed start's log.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

KV_TOKENS_MARKER = "KV cache size:"
KV_AVAILABLE_MARKER = "Available KV cache memory:"
# Numbers as vLLM prints them, bounded: "1,398,080", "24.83" (never ",", "1.2.3" or 400 digits).
KV_TOKENS = re.compile(r"KV cache size: (\d{1,3}(?:,?\d{3}){0,5}) tokens")
_KV_AVAILABLE = re.compile(r"Available KV cache memory: (\d{1,9}(?:\.\d{1,6})?) GiB")
_GiB = 2**30

# Words that only the fact lines carry: the serving stats line says "GPU KV cache usage" every
# few seconds and must not send every block through the line-by-line parser.
FACT_MARKERS = (KV_TOKENS_MARKER, KV_AVAILABLE_MARKER)


def kv_tokens_of(text: str) -> int:
    """The token count KV_TOKENS captured: "1,398,080" -> 1398080."""
    return int(text.replace(",", ""))


def kv_tokens(line: str) -> int | None:
    """The KV cache size in tokens a line states, else None."""
    m = KV_TOKENS.search(line) if KV_TOKENS_MARKER in line else None
    return kv_tokens_of(m.group(1)) if m else None


@dataclass(frozen=True)
class LogFacts:
    """What the engine told about its KV cache at startup; None until it said so."""

    kv_tokens: int | None = None
    available_kv_bytes: int | None = None


def parse_fact(line: str, facts: LogFacts) -> LogFacts:
    """The facts after one more line."""
    if not any(marker in line for marker in FACT_MARKERS):
        return facts
    if (tokens := kv_tokens(line)) is not None:
        return LogFacts(tokens, facts.available_kv_bytes)
    if m := _KV_AVAILABLE.search(line):
        return LogFacts(facts.kv_tokens, int(float(m.group(1)) * _GiB))
    return facts
