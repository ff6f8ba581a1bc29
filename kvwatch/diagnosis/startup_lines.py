"""The engine's startup lines about its KV cache and GPU memory (docs/vllm-facts.md §5), parsed in one place. Pure.

vLLM logs "KV cache size: N tokens" ("GPU" or, on the CPU backend, "CPU"), and where its GPU memory
went. vLLM 0.32 (v1/worker/gpu_worker.py, gpu_model_runner.py) and the V1 engines before it log at INFO
  "Model loading took 14.2488 GiB and 4.42 seconds"
  "Available KV cache memory: 24.83 GiB"
  "Graph capturing finished in 3 secs, took 0.50 GiB"
and the V0 workers of 0.6-0.8 (worker/worker.py) one line with the whole profile:
  "model weights take 19.86GiB; non_torch_memory takes 0.16GiB; PyTorch activation peak memory
   takes 36.63GiB; the rest of the memory reserved for KV Cache is 14.65GiB."
vLLM 0.34's extensible KV cache (on by default on CUDA) logs the profile's "Available KV cache memory"
as a tentative upper bound, then sizes the cache after warm-up and CUDA graph capture
(vllm/v1/worker/extensible_kv_cache.py:693-707 and :536-540):
  "Memory after warmup: 59.1 GiB free, 0.02 GiB committed to the KV cache, 2.72 GiB kept for transient
   activations (2.72 GiB allocated at peak, 0.0 GiB of torch reservation growth); 17117 KV cache blocks
   (58.51 GiB) fit within the requested 79.18 GiB. Torch may reserve up to 3.5 GiB."
  "Extended KV cache to 17117 blocks (58.51 GiB)."
The final figure replaces the tentative one (kept as tentative_kv_bytes); the "GPU KV cache size" line
follows the extension there (vllm/v1/engine/core.py:382-414), so a figure is settled once it is seen.
(0.6.4: one line of name=value figures, "Memory profiling results: total_gpu_memory=47.54GiB ...
non_torch_memory=0.44GiB kv_cache_size=22.74GiB gpu_memory_utilization=0.90", worker/worker.py:232-243;
0.6.5: one figure a line, "model weights take   14.96GiB", "available_kv_cache_memory    53.29GiB";
0.7: "Loading model weights took 13.9 GB", vLLM's GB there being 2**30 bytes). GiB figures are
printed rounded (0.01 GiB, weights 0.0001 GiB). With tensor parallelism each worker prints its own
line: the figures are one rank's. The output pump reads these lines while the engine starts
(kvwatch_kv_actual_bytes' cross-check, kvwatch_engine_memory_bytes) and the diagnosis reads them
from a failed start's log.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.vllm_releases.startup_plan import MARKERS as STARTUP_PLAN_MARKERS
from kvwatch.vllm_releases.startup_plan import parse_plan_line

GiB = 2**30
KV_TOKENS_MARKER = "KV cache size:"
# Numbers as vLLM prints them, bounded: "1,398,080", "24.83" (never ",", "1.2.3" or 400 digits).
KV_TOKENS = re.compile(r"KV cache size: (\d{1,3}(?:,?\d{3}){0,5}) tokens")
_DIGITS = r"(-?\d{1,9}(?:\.\d{1,6})?)"
_GIB = _DIGITS + r"\s*GiB"
# 0.6.4's one profile line, as far as a figure of it: its name=value figures are read only there (later
# releases log a profile result's repr whose non_torch_memory is another quantity).
_V064_PROFILE = r"Memory profiling results: total_gpu_memory=.{0,300}?"
# One pattern per figure: V0 printed them all on one line, 0.6.5 one per line.
_MEMORY = {
    "weights_bytes": re.compile(r"(?:Model loading took|model weights take|Loading model weights took)\s+" +
                                _DIGITS + r"\s*Gi?B"),
    "available_kv_bytes": re.compile(r"(?:(?:Available KV cache memory:|available_kv_cache_memory|"
                                     r"the rest of the memory reserved for KV Cache is)\s+|"
                                     + _V064_PROFILE + r"kv_cache_size=)" + _GIB),
    "cuda_graph_bytes": re.compile(r"Graph capturing finished in [\d.]+ secs?, took " + _GIB),
    "activation_peak_bytes": re.compile(r"PyTorch activation peak memory(?: takes)?\s+" + _GIB),
    "non_torch_bytes": re.compile(r"(?:non_torch_memory(?: takes)?\s+|" + _V064_PROFILE + r"non_torch_memory=)" + _GIB),
}
# vLLM 0.34's post-warm-up sizing (extensible_kv_cache.py:693-707, :536-540): the final KV cache.
_WARMUP_SIZED = re.compile(r"Memory after warmup: .{0,400}?\(" + _GIB + r" allocated at peak, .{0,200}?; "
                           r"(\d{1,12}) KV cache blocks \(" + _GIB + r"\) fit within the requested " + _GIB)
_EXTENDED = re.compile(r"Extended KV cache to (\d{1,12}) blocks \(" + _GIB + r"\)")
# The parts of one GPU's memory the engine states, by the `part` label of kvwatch_engine_memory_bytes.
MEMORY_PARTS = ("weights", "activation_peak", "non_torch", "cuda_graphs", "kv_cache")
# vLLM's last start-up line (V0 and V1, GPU and CPU): every fact above comes before it.
STARTED_MARKER = "init engine (profile, create kv cache"
# Words that only the fact lines carry, for a cheap check before any regex: the serving stats line
# says "GPU KV cache usage" every few seconds and must not send every block through the parser.
FACT_MARKERS = (KV_TOKENS_MARKER, "KV cache memory:", "Model loading took", "model weights take",
                "Loading model weights took", "available_kv_cache_memory", "reserved for KV Cache",
                "Graph capturing finished", "activation peak memory", "non_torch_memory", STARTED_MARKER,
                "Memory after warmup:", "Extended KV cache to", "kv_cache_size=",
                *STARTUP_PLAN_MARKERS)


def kv_tokens_of(text: str) -> int:
    """The token count KV_TOKENS captured: "1,398,080" -> 1398080."""
    return int(text.replace(",", ""))


def kv_tokens(line: str) -> int | None:
    """The KV cache size in tokens a line states, else None."""
    m = KV_TOKENS.search(line) if KV_TOKENS_MARKER in line else None
    return kv_tokens_of(m.group(1)) if m else None


@dataclass(frozen=True)
class LogFacts:
    """What the engine told at startup about its KV cache and one GPU's memory; None until it said so."""

    kv_tokens: int | None = None
    available_kv_bytes: int | None = None        # the KV cache's memory (0 where V0 logged a negative rest)
    weights_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    activation_peak_bytes: int | None = None     # V0's profile only; V1 logs it at DEBUG
    non_torch_bytes: int | None = None           # V0's profile only
    started: bool = False                        # the engine logged the end of its start-up
    startup_plan_kv_bytes: int | None = None     # vLLM applied its persisted start-up plan: no profile ran
    startup_plan_path: str | None = None         # where vLLM saved its start-up plan
    tentative_kv_bytes: int | None = None        # 0.34's profile figure, replaced by the post-warm-up one
    sized_after_warmup: bool = False             # available_kv_bytes is the extensible cache's final size

    @property
    def settled_kv_bytes(self) -> int | None:
        """The KV cache's memory once no later line can change it: after the "KV cache size" line
        (which follows 0.34's extension), the post-warm-up sizing or a start-up plan; None while the
        figure may still be 0.34's tentative one. What to learn from."""
        if self.sized_after_warmup or self.kv_tokens is not None or self.available_kv_bytes is None:
            return self.kv_cache_bytes
        return None

    @property
    def kv_cache_bytes(self) -> int | None:
        """The KV cache's memory: as the profile left it, else as vLLM's own start-up plan set it."""
        return self.available_kv_bytes if self.available_kv_bytes is not None else self.startup_plan_kv_bytes

    def memory_parts(self) -> dict[str, int]:
        """The GPU memory parts the engine stated, by the `part` label kvwatch exports them under."""
        named = {"weights": self.weights_bytes, "activation_peak": self.activation_peak_bytes,
                 "non_torch": self.non_torch_bytes, "cuda_graphs": self.cuda_graph_bytes,
                 "kv_cache": self.kv_cache_bytes}
        return {part: value for part, value in named.items() if value is not None}


def _bytes(text: str) -> int:
    return max(0, int(float(text) * GiB))


def parse_fact(line: str, facts: LogFacts) -> LogFacts:
    """The facts after one more line."""
    if not any(marker in line for marker in FACT_MARKERS):
        return facts
    if (tokens := kv_tokens(line)) is not None:
        return replace(facts, kv_tokens=tokens)
    if STARTED_MARKER in line:
        return replace(facts, started=True)
    if (plan := parse_plan_line(line)) is not None:
        return replace(facts, startup_plan_kv_bytes=plan.applied_kv_bytes or facts.startup_plan_kv_bytes,
                       startup_plan_path=plan.saved_path or facts.startup_plan_path)
    if (m := _EXTENDED.search(line) or _WARMUP_SIZED.search(line)) is not None:
        final = _bytes(m[2]) if m.re is _EXTENDED else _bytes(m[3])
        peak = facts.activation_peak_bytes if m.re is _EXTENDED else _bytes(m[1])
        tentative = facts.tentative_kv_bytes if facts.sized_after_warmup else facts.available_kv_bytes
        return replace(facts, available_kv_bytes=final, tentative_kv_bytes=tentative, sized_after_warmup=True,
                       activation_peak_bytes=peak)
    found: dict[str, Any] = {name: _bytes(m[1]) for name, regex in _MEMORY.items() if (m := regex.search(line))}
    if facts.sized_after_warmup:   # nothing logged after the sizing replaces its figure
        found.pop("available_kv_bytes", None)
    return replace(facts, **found) if found else facts


def parse_facts(lines: list[str]) -> LogFacts:
    """The facts of a whole log."""
    facts = LogFacts()
    for line in lines:
        facts = parse_fact(line, facts)
    return facts
