"""The GPU's free memory at start, where the user states it (`--gpu-free-memory`), and what vLLM does
with it, release by release (pure).

A card is not always empty when vLLM starts: a desktop holds part of a consumer card, WSL2 keeps a
reserve, and on unified memory (GB10) the host's own use comes out of the same memory. vLLM's budget
is still the CUDA total x the utilization; the free memory decides what happens around it:

- **V1, from 0.9**: the worker's first snapshot refuses to start when its free memory is below the
  budget (vLLM 0.9.2 vllm/v1/worker/gpu_worker.py:140-153; 0.28.0 vllm/v1/worker/utils.py:444-464
  `request_memory`; 0.34.0 vllm/v1/worker/utils.py:783-797, where the extensible KV cache skips the
  check). The fix is the utilization the free memory covers. First in 0.9.1 (vllm/v1/worker/gpu_worker.py:135-150,
  with the baseline snapshot's profile, :201); absent from 0.9.0's V1 worker (:132 `init_gpu_memory`, no check)
  and 0.8.5.post1's.
- **V1 before 0.9.1**: no check, but the profile counts everything the card has in use beyond torch's
  allocations as non-torch memory (vLLM 0.8.5.post1 vllm/v1/worker/gpu_worker.py:180-210, 0.9.0 :184-212:
  `mem_get_info` total - free - torch's allocated bytes), so another process's memory comes out of
  the KV cache.
- **V0**: the profile's non-torch figure is the increase since the worker's baseline snapshot (vLLM
  0.8.5.post1 vllm/worker/worker.py:181 and 242-256), so memory in use before start does not count,
  and no check refuses the start: the budget is unchanged.
- **0.34's extensible KV cache**: sized from the free memory after warm-up (planner/extensible_kv.py);
  the stated free memory replaces the clean card's.

The stated figure is the free memory before vLLM starts (nvidia-smi's free, or
torch.cuda.mem_get_info()'s in another process); the worker's snapshot comes after vLLM's own CUDA
context, which the clean-card figure of extensible_kv.CUDA_CONTEXT_BYTES measures.
"""
from __future__ import annotations

import math
from dataclasses import replace

from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device, GiB, cuda_total_bytes
from kvwatch.planner.extensible_kv import CUDA_CONTEXT_BYTES
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.predicted_refusal import GPU_MEMORY_BUSY, PredictedRefusal
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE

START_CHECK_SINCE = (0, 9, 1)   # V1's worker refuses a start short of free memory (0.9.1 gpu_worker.py:135-150)
V1 = "v1"   # gpu_budget.V1_ENGINE (not imported: gpu_budget imports this module)


def with_free_memory(device: Device, free_bytes: int) -> Device:
    """The device with the free memory the user states; one clear error for a figure that cannot be."""
    if device.platform != "cuda":
        raise KvwatchError("--gpu-free-memory is for a GPU plan (--gpu, --preset or --compute-capability)")
    if free_bytes <= 0:
        raise KvwatchError(f"--gpu-free-memory must be more than 0 (got {free_bytes} bytes)")
    total = max(device.total_memory_bytes or 0, cuda_total_bytes(device))
    if free_bytes > total:
        raise KvwatchError(f"--gpu-free-memory {free_bytes / GiB:.2f} GiB is more than {device.name}'s "
                           f"{total / GiB:.2f} GiB in all")
    return replace(device, free_memory_bytes=free_bytes)


def snapshot_free_bytes(device: Device) -> int:
    """What the worker's first snapshot finds free: the stated free memory (at most the CUDA total),
    else a clean card's, less vLLM's own CUDA context."""
    total = cuda_total_bytes(device)
    free = min(device.free_memory_bytes, total) if device.free_memory_bytes else total
    return max(0, free - CUDA_CONTEXT_BYTES)


def others_non_torch_bytes(device: Device, engine: str, version: VllmVersion | None) -> int:
    """Memory other processes hold that the profile counts as non-torch: V1 before 0.9.1 only."""
    if device.free_memory_bytes is None or engine != V1 or (version or DEFAULT_RELEASE).parts >= START_CHECK_SINCE:
        return 0
    total = cuda_total_bytes(device)
    return max(0, total - min(device.free_memory_bytes, total))


def start_refusal(device: Device, engine: str, version: VllmVersion | None, utilization: float,
                  extensible: bool) -> PredictedRefusal | None:
    """V1's refusal to start on a card with less free memory than its budget (from 0.9; not with
    0.34's extensible KV cache), and the utilization the free memory covers as the fix."""
    if (device.free_memory_bytes is None or device.platform != "cuda" or engine != V1 or extensible
            or (version or DEFAULT_RELEASE).parts < START_CHECK_SINCE):
        return None
    total = cuda_total_bytes(device)
    requested = math.ceil(total * utilization)
    free = snapshot_free_bytes(device)
    if free >= requested:
        return None
    fitted = math.floor(free / total * 100) / 100
    fix = FlagChange({"--gpu-memory-utilization": fitted}) if fitted > 0 else NO_CHANGE
    return PredictedRefusal(
        GPU_MEMORY_BUSY,
        f"Free memory on device ({free / GiB:.2f}/{total / GiB:.2f} GiB) on startup is less than desired GPU "
        f"memory utilization ({utilization:g}, {requested / GiB:.2f} GiB): the stated --gpu-free-memory "
        f"{device.free_memory_bytes / GiB:.2f} GiB less vLLM's CUDA context {CUDA_CONTEXT_BYTES / GiB:.2f} GiB",
        fix)
