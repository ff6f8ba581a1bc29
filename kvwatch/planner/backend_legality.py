"""Whether the attention backend vLLM picks can run this cache, and the flag that makes one legal (pure)."""
from __future__ import annotations

from kvwatch.planner.backends import BackendChoice, kv_dtype_reason
from kvwatch.planner.cpu_mla import AMX_MLA, amx_head_size_risk
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.predicted_refusal import (
    BLOCK_SIZE_UNSUPPORTED,
    KV_DTYPE_UNSUPPORTED,
    NO_ATTENTION_BACKEND,
    PredictedRefusal,
)
from kvwatch.planner.rules import RuleSet


def backend_refusals(choice: BackendChoice, rules: RuleSet, device: Device, geometry: ModelGeometry,
                     settings: EngineSettings) -> list[PredictedRefusal]:
    """What vLLM will refuse of the backend it picks (a kernel's limit), or, with none valid, the one
    flag change that would make one valid, in vLLM's priority order."""
    kv_dtype = settings.kv_cache_dtype
    if choice.backend is not None:
        risk = amx_head_size_risk(geometry.head_size) if choice.backend.name == AMX_MLA else None
        return [PredictedRefusal(limit.kind, limit.message, limit.fix)
                for limit in rules.kernel_limits
                if limit.backend == choice.backend.name and kv_dtype in limit.kv_dtypes
                and device.compute_capability and device.compute_capability[0] in limit.capability_majors] + \
            ([PredictedRefusal(NO_ATTENTION_BACKEND, risk, NO_CHANGE, certain=False)] if risk else [])
    # No backend: say which single flag change would make one valid, in priority order.
    candidates = [b for n in choice.candidates if (b := rules.backend(n)) is not None
                  and b.supports_capability(device.compute_capability)
                  and (b.head_sizes is None or geometry.head_size in b.head_sizes)
                  and b.attention == geometry.attention and b.platform == device.platform]
    summary = "; ".join(f"{k}: {', '.join(v)}" for k, v in choice.reasons.items())
    if settings.attention_backend and not candidates:
        return [PredictedRefusal(NO_ATTENTION_BACKEND,
                         f"--attention-backend {settings.attention_backend} is not valid here ({summary})",
                         FlagChange(remove=("--attention-backend",)))]
    dtype_ok = [b for b in candidates if kv_dtype_reason(b, kv_dtype, device, geometry) is None]
    if candidates and not dtype_ok:
        return [PredictedRefusal(KV_DTYPE_UNSUPPORTED,
                         f"no attention backend on {device.name} stores a {kv_dtype} KV cache for this "
                         f"model ({summary})", FlagChange({"--kv-cache-dtype": "auto"}))]
    if dtype_ok and settings.block_size is not None:
        best = dtype_ok[0]
        legal = best.smallest_block_size_at_least(settings.block_size)
        sizes = ", ".join(str(s) for s in best.block_sizes)
        return [PredictedRefusal(BLOCK_SIZE_UNSUPPORTED,
                         f"block size {settings.block_size} is not supported by {best.name} ([{sizes}]); "
                         f"the smallest legal size at least as large is {legal}",
                         FlagChange({"--block-size": legal}))]
    return [PredictedRefusal(NO_ATTENTION_BACKEND,
                     f"no attention backend of vLLM runs this model on {device.name} "
                     f"(compute capability {device.sm}): {summary}", NO_CHANGE)]
