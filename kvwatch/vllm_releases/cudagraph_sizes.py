"""The CUDA graph sizes vLLM captures by default, release by release (pure).

The default list (vLLM 0.34.0, vllm/config/vllm.py:2371-2504 `_set_cudagraph_sizes`; the same rule in
0.33.0 :2447-2605): token counts 1, 2, 4, every 8 below 256, every 16 from 256, up to
min(2 x max_num_seqs, 1024 on the SM100 family (compute capability 10.x) else 512,
max_num_batched_tokens), with max_num_batched_tokens and max_num_seqs added where they fit.

0.34 splits the graphs into mixed-batch (PIECEWISE) graphs of token counts and uniform-decode (FULL)
graphs of request counts (vllm/config/vllm.py:2558-2735 `_split_cudagraph_capture_sizes`). On the
SM100 family, when no capture size is set, both take wider grids of their own (:2603-2611, "wide
defaults"): the prefill grid up to min(8192, max_num_batched_tokens) (:2637-2643;
vllm/config/compilation.py:78-99), the decode grid up to max_num_seqs requests (:2656-2661;
compilation.py:122-126), a decode graph at most 8192 tokens (:2611, :2681-2684; compilation.py:54-68).
The recorded list (`cudagraph_capture_sizes`, :2731) is every graph's token count: 91 sizes up to
8192 tokens for 1,024 sequences where 0.33 captured 83 up to 1,024. Elsewhere 0.34 keeps the
default list. Modelled for what kvwatch plans: no speculative decoding, the default
FULL_AND_PIECEWISE mode and "balanced" performance mode, no capture size set by a flag.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

WIDE_SINCE = (0, 34, 0)
WIDE_SOURCE = "vLLM 0.34.0, vllm/config/vllm.py:2603-2611"
DEFAULT_SOURCE = "vLLM 0.34.0, vllm/config/vllm.py:2371-2504"
SM100_FAMILY = 10                  # is_device_capability_family(100): any 10.x
DEFAULT_MAX = 512
SM100_DEFAULT_MAX = 1024
WIDE_MAX_TOKENS = 8192             # the prefill grid's and a decode graph's default ceiling (:2611, :2639)


@dataclass(frozen=True)
class CaptureSizes:
    """The token counts of the CUDA graphs a release captures by default, and why."""

    tokens: tuple[int, ...]        # ascending: what vLLM records as cudagraph_capture_sizes
    wide: bool                     # 0.34's wider SM100 grids
    source: str

    @property
    def largest(self) -> int:
        return self.tokens[-1] if self.tokens else 0


def default_sizes(max_num_seqs: int, max_num_batched_tokens: int, sm100: bool) -> list[int]:
    """The default list of _set_cudagraph_sizes for one token per decode request."""
    ceiling = min(max_num_seqs * 2, SM100_DEFAULT_MAX if sm100 else DEFAULT_MAX)
    decode = [max_num_seqs] if max_num_seqs <= ceiling else []
    ceiling = min(max_num_batched_tokens, ceiling)
    sizes = [i for i in (1, 2, 4) if i <= ceiling]
    if ceiling >= 8:
        sizes += range(8, min(ceiling + 1, 256), 8)
    if ceiling >= 256:
        sizes += range(256, ceiling + 1, 16)
    if max_num_batched_tokens <= ceiling:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in decode if s <= max_num_batched_tokens]
    return sorted(set(sizes))


def _walk_grid(limit: int, step: Callable[[int], float]) -> list[int]:
    """Sizes 1 up to `limit`, each the next multiple of the largest power of two not above
    step(size) (compilation.py:78-86)."""
    grid, size = [], 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def prefill_grid(max_tokens: int) -> list[int]:
    """Token counts of 0.34's prefill grid ("balanced" mode, compilation.py:89-99)."""
    return _walk_grid(max_tokens, lambda t: min(t, max(8, t / 4), 0.07 * max(t, 4096)))


def decode_grid(max_requests: int) -> list[int]:
    """Request counts of 0.34's decode grid (compilation.py:122-126)."""
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def wide_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """0.34's recorded token counts with the SM100 wide defaults: the prefill grid and the decode
    graphs, a request count past the decode limit captured at the limit (compilation.py:54-68)."""
    prefill = prefill_grid(min(WIDE_MAX_TOKENS, max_num_batched_tokens))
    requests = decode_grid(max_num_seqs)
    limit = min(max_num_seqs, min(max_num_batched_tokens, WIDE_MAX_TOKENS))
    decode = {min(n, limit) for n in requests[:bisect.bisect_left(requests, limit) + 1]} if limit >= 1 else set()
    return sorted(decode | set(prefill))


def capture_sizes(parts: tuple[int, int, int], capability: tuple[int, int] | None, max_num_seqs: int,
                  max_num_batched_tokens: int, sizes_given: bool = False) -> CaptureSizes:
    """The graphs the release captures for this card and batch. `sizes_given`: a flag sets capture
    sizes, which kvwatch does not read: the default list stands in (the deprecated fields turn the
    wide grids off, :2603-2606; the split fields replace the grids they set)."""
    sm100 = capability is not None and capability[0] == SM100_FAMILY
    if sm100 and parts >= WIDE_SINCE and not sizes_given:
        return CaptureSizes(tuple(wide_sizes(max_num_seqs, max_num_batched_tokens)), True, WIDE_SOURCE)
    return CaptureSizes(tuple(default_sizes(max_num_seqs, max_num_batched_tokens, sm100)), False, DEFAULT_SOURCE)
