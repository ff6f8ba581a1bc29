"""A failure the planner predicts vLLM will meet, with the flag change that avoids it (pure)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.flag_change import FlagChange

# Kinds of predicted refusal: the failure classes vLLM's refusal would be diagnosed as.
BLOCK_SIZE_UNSUPPORTED = FailureKind.BLOCK_SIZE_UNSUPPORTED
KV_DTYPE_UNSUPPORTED = FailureKind.KV_DTYPE_UNSUPPORTED
KERNEL_OUT_OF_RESOURCES = FailureKind.KERNEL_OUT_OF_RESOURCES
KV_CACHE_TOO_SMALL = FailureKind.KV_CACHE_TOO_SMALL
NO_KV_CACHE_MEMORY = FailureKind.NO_KV_CACHE_MEMORY
NO_ATTENTION_BACKEND = FailureKind.NO_ATTENTION_BACKEND
CONFIG_REFUSED = FailureKind.CONFIG_REFUSED
MAMBA_CACHE_TOO_SMALL = FailureKind.MAMBA_CACHE_TOO_SMALL
GPU_MEMORY_BUSY = FailureKind.GPU_MEMORY_BUSY


@dataclass(frozen=True)
class PredictedRefusal:
    """A failure vLLM will (or likely will) meet with this plan, and the flag change that avoids it."""

    kind: FailureKind
    message: str
    fix: FlagChange              # the flag change that avoids it (empty: no flag change does)
    certain: bool = True         # vLLM will fail for sure (not only "likely")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "message": self.message, "fix": self.fix.as_flags(), "certain": self.certain}
