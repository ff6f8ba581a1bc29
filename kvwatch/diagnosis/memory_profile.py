"""Where the engine says its GPU memory went, from its own start-up lines (pure).

vLLM 0.32 (v1/worker/gpu_worker.py, gpu_model_runner.py) logs at INFO
  "Model loading took 14.2488 GiB and 4.42 seconds"
  "Available KV cache memory: 24.83 GiB"
  "Graph capturing finished in 3 secs, took 0.50 GiB"
and the V0 workers of 0.6-0.8 (worker/worker.py) one line with the whole profile:
  "model weights take 19.86GiB; non_torch_memory takes 0.16GiB; PyTorch activation peak memory
   takes 36.63GiB; the rest of the memory reserved for KV Cache is 14.65GiB."
GiB figures are printed rounded (0.01 GiB, weights 0.0001 GiB). With tensor parallelism each
worker prints its own line; the figures are one rank's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

GiB = 2**30

_DIGITS = r"(-?\d{1,9}(?:\.\d{1,6})?)"   # bounded: never "1.2.3" or 400 digits
_NUMBER = _DIGITS + r"\s*GiB"
# Each figure has its own pattern: V0 printed them on one line ("x take A GiB; y takes B GiB; ..."),
# 0.6.5 one per line ("model weights take   14.96GiB"), 0.7 "Loading model weights took 13.9 GB"
# (vLLM's GB there is 2**30 bytes).
_PATTERNS = {
    "weights_bytes": re.compile(r"(?:Model loading took|model weights take|Loading model weights took)\s+" +
                                _DIGITS + r"\s*Gi?B"),
    "kv_cache_bytes": re.compile(r"(?:Available KV cache memory:|available_kv_cache_memory|"
                                 r"the rest of the memory reserved for KV Cache is)\s+" + _NUMBER),
    "cuda_graph_bytes": re.compile(r"Graph capturing finished in [\d.]+ secs?, took " + _NUMBER),
    "activation_peak_bytes": re.compile(r"PyTorch activation peak memory(?: takes)?\s+" + _NUMBER),
    "non_torch_bytes": re.compile(r"non_torch_memory(?: takes)?\s+" + _NUMBER),
}
MARKERS = ("Model loading took", "model weights take", "Loading model weights took", "KV cache memory",
           "available_kv_cache_memory", "reserved for KV Cache", "Graph capturing finished",
           "activation peak memory", "non_torch_memory")


@dataclass(frozen=True)
class MemoryProfile:
    """One rank's GPU memory as the engine reported it; None where it did not say."""

    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    activation_peak_bytes: int | None = None     # V0's line only; 0.32 logs it at DEBUG
    non_torch_bytes: int | None = None           # V0's line only

    def parts(self) -> dict[str, int]:
        """The parts the engine named, by the `part` label kvwatch exports them under."""
        named = {"weights": self.weights_bytes, "kv_cache": self.kv_cache_bytes,
                 "cuda_graphs": self.cuda_graph_bytes, "activation_peak": self.activation_peak_bytes,
                 "non_torch": self.non_torch_bytes}
        return {part: value for part, value in named.items() if value is not None}


def _bytes(text: str) -> int:
    return int(round(float(text) * GiB))


def parse_profile_line(line: str, profile: MemoryProfile) -> MemoryProfile:
    """The profile after one more line of the engine's output."""
    if not any(marker in line for marker in MARKERS):
        return profile
    found = {name: max(0, _bytes(m[1])) for name, regex in _PATTERNS.items() if (m := regex.search(line))}
    return replace(profile, **found) if found else profile


def parse_profile(lines: list[str]) -> MemoryProfile:
    profile = MemoryProfile()
    for line in lines:
        profile = parse_profile_line(line, profile)
    return profile
