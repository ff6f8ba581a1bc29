"""Who holds the engine's GPUs, through NVML: pids for the leftover check, a GpuContext for remedies.

Off CUDA (the CPU backend) both are empty; NVML is only loaded on a GPU host.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvwatch.boundary import proc_inspect
from kvwatch.diagnosis import GpuContext
from kvwatch.gpu_types import GpuInfo, NvmlSnapshot
from kvwatch.planner.devices import Device

if TYPE_CHECKING:
    from kvwatch.boundary.nvml import Nvml


class GpuView:
    def __init__(self, device: Device | None, ours: Callable[[], frozenset[int]], nvml: Nvml | None = None) -> None:
        self._device = device
        self._ours = ours   # the engine's pids, proven (kvwatch/watchdog/ownership.py)
        self._nvml = nvml   # None: the process's one, loaded on first use on a GPU host

    def snapshot(self) -> NvmlSnapshot | None:
        """NVML now; None off CUDA."""
        return self._snapshot()

    def _snapshot(self) -> NvmlSnapshot | None:
        if self._device is None or self._device.platform != "cuda":
            return None
        if self._nvml is None:
            from kvwatch.boundary.nvml import shared

            self._nvml = shared()
        return self._nvml.snapshot()

    def holders(self) -> list[tuple[str, int]]:
        """(GPU UUID, pid) of every compute process on every GPU NVML shows."""
        snapshot = self._snapshot()
        if snapshot is None:
            return []
        return [(gpu.uuid, p.pid) for gpu in snapshot.gpus for p in gpu.processes or ()]

    def _engine_gpu(self) -> GpuInfo | None:
        """The engine's GPU as NVML shows it now; None off CUDA or when NVML does not show it."""
        snapshot = self._snapshot()
        if snapshot is None or self._device is None:
            return None
        return next((g for g in snapshot.gpus if g.uuid == self._device.uuid), None)

    def foreign_bytes(self) -> int | None:
        """GPU memory held on the engine's GPU by processes that are not this engine's; None when
        NVML does not say (off CUDA, GPU not found, a driver that reports no per-process memory)."""
        gpu = self._engine_gpu()
        if gpu is None:
            return None
        held, ours = 0, self._ours()
        for p in gpu.processes or ():
            if p.pid in ours:
                continue
            if p.used_bytes is None:
                return None
            held += p.used_bytes
        return held

    def context(self) -> GpuContext | None:
        """The engine's GPU now (free memory, holders and whether each is ours); None off CUDA."""
        gpu = self._engine_gpu()
        if gpu is None:
            return None
        free = None
        if gpu.memory_total_bytes is not None and gpu.memory_used_bytes is not None:
            free = gpu.memory_total_bytes - gpu.memory_used_bytes
        ours = self._ours()
        holders = tuple((p.pid, proc_inspect.name_of(p.pid), p.pid in ours)
                        for p in gpu.processes or ())
        return GpuContext(free_bytes=free, total_bytes=gpu.memory_total_bytes, holders=holders)
