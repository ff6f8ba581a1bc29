"""vLLM's block-size rules as values (pure): a fixed size, or MultipleOf(n), as backends declare
them and engines print them; which sizes a set of rules accepts."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MultipleOf:
    """vLLM's MultipleOf(n): any block size that is a multiple of n."""

    base: int

    def __str__(self) -> str:
        return f"MultipleOf({self.base})"


BlockSizeRule = int | MultipleOf


def accepts_block_size(rules: Sequence[BlockSizeRule], block_size: int) -> bool:
    """Whether block size rules (a backend's, or those an engine's message listed) accept a size."""
    return any(block_size % r.base == 0 if isinstance(r, MultipleOf) else block_size == r for r in rules)


def smallest_common_block_size(per_backend: Sequence[Sequence[BlockSizeRule]], at_least: int) -> int | None:
    """The smallest size >= at_least that every backend's rules accept (None when none does)."""
    per_backend = [rules for rules in per_backend if rules]
    if not per_backend:
        return None
    start = max(1, at_least)
    for size in range(start, start + 4096):
        if all(accepts_block_size(rules, size) for rules in per_backend):
            return size
    return None


def parse_block_rule(value: object) -> BlockSizeRule | None:
    """A block size rule as vLLM prints it: 16, "16" or "MultipleOf(16)"; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if text.isdigit():
        return int(text)
    if text.startswith("MultipleOf(") and text.endswith(")") and text[11:-1].isdigit():
        return MultipleOf(int(text[11:-1]))
    return None
