"""What NVML reports, as values: the GPUs, their memory and processes, and CUDA_VISIBLE_DEVICES. Pure.

kvwatch.boundary.nvml (the only module that loads pynvml) produces these; the exporter, the
collector and the watchdog read them without loading NVML.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: the driver does not report it (e.g. WDDM, some vGPUs)


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML enumeration index (nvidia-smi's numbering)
    uuid: str
    name: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    compute_capability: tuple[int, int] | None
    processes: tuple[GpuProcess, ...] | None  # compute processes by pid; None: not available


@dataclass(frozen=True)
class NvmlSnapshot:
    available: bool
    error: str | None  # why NVML is not available
    driver_version: str | None
    gpus: tuple[GpuInfo, ...]
    lost_gpus: tuple[int, ...]  # indices that reported GPU_IS_LOST

    @staticmethod
    def unavailable(error: str) -> NvmlSnapshot:
        return NvmlSnapshot(False, error, None, (), ())


def parse_cuda_visible_devices(value: str | None, devices: Mapping[int, str | None]) -> list[int]:
    """NVML indices a CUDA process would see, in its order, as CUDA parses
    CUDA_VISIBLE_DEVICES: unset = all; comma-separated entries, each an index
    (read like strtoul, so "1gpu" is 1) or a unique prefix of a "GPU-" UUID;
    the first invalid, unknown or ambiguous entry ends the list; a repeated
    device empties it. ``devices`` maps each NVML index to its UUID (None if
    unknown, e.g. lost). MIG UUIDs are not resolved (they end the list).

    Indices are in CUDA's order, which is NVML's (nvidia-smi's) order under
    CUDA_DEVICE_ORDER=PCI_BUS_ID but not always otherwise (CUDA's default
    puts the fastest GPU first); UUIDs are exact.
    """
    if value is None:
        return sorted(devices)
    result: list[int] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith("GPU-"):
            matches = [i for i, uuid in devices.items() if uuid and uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        else:
            digits = entry[: len(entry) - len(entry.lstrip("0123456789"))]
            if not digits or int(digits) not in devices:
                break
            index = int(digits)
        if index in result:
            return []
        result.append(index)
    return result
