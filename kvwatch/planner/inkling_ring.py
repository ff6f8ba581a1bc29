"""Inkling's short-convolution ring: one decoder layer's InklingConvState spec (pure).

vLLM 0.33.0, vllm/models/inkling/nvidia/sconv_swa_attn.py:121-193 (the same file in 0.32.0 and
0.34.0): the layer's four short-convolution streams (K, V, attention output, MLP output) packed into
one SlidingWindowSpec (get_kv_cache_spec, :185-193) of block_size = sliding_window = sconv_kernel_size, num_kv_heads = heads / TP,
head_size the packed width rounded up to a power of two, head_size_v 0, bfloat16. Kept apart from
planner/inkling.py so that planner/layers.py can name it without an import circle.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.errors import ConfigError

_RING_DTYPE_BYTES = 2   # bfloat16, asserted (sconv_swa_attn.py:170): another model dtype is refused there
RING_SOURCE = "vLLM 0.33.0 models/inkling/nvidia/sconv_swa_attn.py"


@dataclass(frozen=True)
class ConvRing:
    """One decoder layer's InklingConvState, before tensor parallelism."""

    kv_heads: int       # the layer's KV heads (swa_ ones on a local layer)
    head_size: int      # the packed, power-of-two head width
    kernel: int         # sconv_kernel_size: its block size and its window

    def heads_per_rank(self, tp: int) -> int:
        if tp > self.kv_heads:
            raise ConfigError(f"Inkling's short-convolution cache supports tensor parallelism up to its "
                              f"{self.kv_heads} KV heads, got {tp} (vLLM asserts it: {RING_SOURCE}:142): "
                              f"choose a -tp of at most {self.kv_heads}")
        return self.kv_heads // tp

    def page_bytes(self, tp: int) -> int:
        """SlidingWindowSpec.page_size_bytes: block x heads x (head_size + 0) x 2 bytes."""
        return self.kernel * self.heads_per_rank(tp) * self.head_size * _RING_DTYPE_BYTES


def ring_head_size(head_dim: int, hidden_size: int, kv_heads: int) -> int:
    """K + V + the attention-output and MLP-output chunks per head, rounded up to a power of two
    (sconv_swa_attn.py:156-157: `1 << (raw - 1).bit_length()`)."""
    raw = 2 * head_dim + 2 * (hidden_size // kv_heads)
    return 1 << (raw - 1).bit_length()
