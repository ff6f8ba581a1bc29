"""The NVML boundary: the only kvwatch module that imports pynvml (nvidia-ml-py).

Shaped after nvitop's libnvml: every call goes through one query function,
init is lazy and locked, what the driver does not report is None ("not
available") instead of an exception, and GPU_IS_LOST marks the device lost.
Nothing here raises to callers: without a driver, a snapshot says
``available=False`` and why.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from kvwatch.gpu_types import GpuInfo, GpuProcess, NvmlSnapshot, parse_cuda_visible_devices

_LOG = logging.getLogger(__name__)

LIBRARY_ENV = "KVWATCH_NVML_LIBRARY"
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
_T = TypeVar("_T")


class _GpuLost(Exception):
    """Raised inside this module only: the device answered GPU_IS_LOST."""


# Errors that are about NVML as a whole rather than one field of one device:
# they end the snapshot (and Uninitialized makes the next one re-init).
_FATAL = (pynvml.NVMLError_Uninitialized, pynvml.NVMLError_DriverNotLoaded,
          pynvml.NVMLError_LibRmVersionMismatch, pynvml.NVMLError_LibraryNotFound)

# What pynvml raises when the driver lacks the version an unversioned call
# picks: NVMLLibraryMismatchError in newer releases, FunctionNotFound in older.
_VERSION_MISSING = (pynvml.NVMLError_FunctionNotFound,
                    getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError_FunctionNotFound))

# A library path can be preloaded only once per process: pynvml keeps the
# first libnvidia-ml.so.1 it loaded for the life of the process.
_preload_lock = threading.Lock()
_preloaded: dict[str, ctypes.CDLL] = {}


def _preload(path: str) -> str | None:
    """dlopen ``path`` before pynvml does: pynvml's CDLL("libnvidia-ml.so.1")
    then resolves to it, because the dynamic loader matches a bare name
    against the SONAME of objects already loaded. Returns an error or None."""
    with _preload_lock:
        if path in _preloaded:
            return None
        if _preloaded:
            loaded = next(iter(_preloaded))
            return f"NVML library {loaded} already loaded in this process, cannot load {path}"
        try:
            _preloaded[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            return f"cannot load NVML library {path}: {exc}"
        return None


class Nvml:
    """One per process; thread-safe. Inits NVML on first use and again after
    :meth:`shutdown` or a failed init (the driver may come back)."""

    def __init__(self, library_path: str | None = None) -> None:
        self._library_path = library_path or os.environ.get(LIBRARY_ENV) or None
        self._lock = threading.RLock()
        self._initialized = False
        self._last_error: str | None = None
        self._no_driver = False   # the last init found no NVML library or no driver on this host
        self._memory_v2 = hasattr(pynvml, "nvmlMemory_v2")  # False once the driver lacks it
        self._processes_v3 = True  # False once the driver lacks _v3 (older drivers)
        # A GPU's name and compute capability by UUID: fixed for the card, so read once per init, not
        # every tick (2 of the 6 NVML calls a GPU takes; bench/bench_overhead.py reads 8 GPUs a second).
        self._fixed: dict[str, tuple[str, tuple[int, int]]] = {}
        # A device's handle and UUID by index, and the driver's version: NVML enumerates the devices
        # at init, and a handle is valid (the same device) until shutdown, so they too are read once
        # per init, not every tick (another 2 of the 4 calls a GPU took, and 1 of the snapshot's 2).
        # A device that answers GPU_IS_LOST, or a change in the device count, reads them again.
        self._devices: dict[int, tuple[Any, str]] = {}
        self._device_count: int | None = None
        self._driver: str | None = None

    # -- public --------------------------------------------------------------

    def snapshot(self) -> NvmlSnapshot:
        """All GPUs, all fields. A lost GPU is left out of ``gpus`` and listed in ``lost_gpus``."""
        with self._lock:
            try:
                return self._snapshot()
            except Exception as exc:  # the boundary never raises; log what we did not foresee
                _LOG.exception("NVML snapshot failed")
                return NvmlSnapshot.unavailable(f"unexpected: {exc!r}")

    def driver_present(self) -> bool:
        """Whether this host has NVML to ask: False only when init finds no NVML library or no driver
        (a CPU host). Any other failure is a driver that is there and failing: that is news."""
        with self._lock:
            self._ensure_init()
            return not self._no_driver

    def device(self, index: int) -> GpuInfo | None:
        """One GPU by NVML index; None if NVML is unavailable, the index does not exist or it is lost."""
        with self._lock:
            try:
                if self._ensure_init() is not None:
                    return None
                info = self._read_device(index)
                return info if isinstance(info, GpuInfo) else None
            except pynvml.NVMLError as exc:
                self._fatal(exc)
                return None
            except Exception:
                _LOG.exception("NVML device(%d) failed", index)
                return None

    def visible_device(self, cuda_visible_devices: str | None) -> GpuInfo | None:
        """The first GPU a CUDA process sees under this CUDA_VISIBLE_DEVICES value."""
        snap = self.snapshot()
        if not snap.available:
            return None
        by_index = {gpu.index: gpu for gpu in snap.gpus}
        uuids: dict[int, str | None] = {i: None for i in snap.lost_gpus}
        uuids.update({gpu.index: gpu.uuid for gpu in snap.gpus})
        visible = parse_cuda_visible_devices(cuda_visible_devices, uuids)
        return by_index.get(visible[0]) if visible else None

    def shutdown(self) -> None:
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                _LOG.warning("nvmlShutdown: %s", exc)

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # -- internals (called with self._lock held) -------------------------------

    def _ensure_init(self) -> str | None:
        if self._initialized:
            return None
        error = _preload(self._library_path) if self._library_path else None
        if error is None:
            try:
                pynvml.nvmlInit()
                self._initialized = True
                self._fixed.clear()
                self._devices.clear()
                self._device_count = self._driver = None
                self._no_driver = False
                error = self._check_loaded_library()
            except pynvml.NVMLError as exc:
                error = f"nvmlInit: {exc}"
                self._no_driver = isinstance(exc, (pynvml.NVMLError_LibraryNotFound,
                                                   pynvml.NVMLError_DriverNotLoaded))
                if self._library_path and isinstance(exc, pynvml.NVMLError_LibraryNotFound):
                    error += f" (is the SONAME of {self._library_path} libnvidia-ml.so.1?)"
        if error != self._last_error:  # log changes, not every tick
            if error:
                _LOG.warning("NVML not available: %s", error)
            else:
                _LOG.info("NVML initialized")
            self._last_error = error
        return error

    def _check_loaded_library(self) -> str | None:
        """A configured library must be the one pynvml uses (its SONAME must be libnvidia-ml.so.1)."""
        wanted = _preloaded.get(self._library_path or "")
        if wanted is None or getattr(pynvml.nvmlLib, "_handle", None) == wanted._handle:
            return None
        self.shutdown()
        return f"pynvml did not load {self._library_path} (is its SONAME libnvidia-ml.so.1?)"

    def _fatal(self, exc: pynvml.NVMLError) -> str:
        if isinstance(exc, pynvml.NVMLError_Uninitialized):
            self._initialized = False  # someone shut NVML down; init again next time
        return f"NVML: {exc}"

    def _snapshot(self) -> NvmlSnapshot:
        error = self._ensure_init()
        if error is not None:
            return NvmlSnapshot.unavailable(error)
        try:
            if self._driver is None:
                self._driver = self._query(pynvml.nvmlSystemGetDriverVersion)
            driver = self._driver
            count = pynvml.nvmlDeviceGetCount()
            if count != self._device_count:
                self._devices.clear()
                self._device_count = count
            gpus: list[GpuInfo] = []
            lost: list[int] = []
            for index in range(count):
                info = self._read_device(index)
                if info is _GpuLost:
                    lost.append(index)
                elif isinstance(info, GpuInfo):
                    gpus.append(info)
        except pynvml.NVMLError as exc:  # fatal ones from _query, any from the count
            return NvmlSnapshot.unavailable(self._fatal(exc))
        return NvmlSnapshot(True, None, driver, tuple(gpus), tuple(lost))

    def _query(self, fn: Callable[..., _T], *args: Any) -> _T | None:
        """Every per-field NVML call goes through here: not supported, not
        found, no permission, ... -> None; GPU_IS_LOST -> _GpuLost; errors
        about NVML as a whole propagate."""
        try:
            return fn(*args)
        except pynvml.NVMLError_GpuIsLost:
            raise _GpuLost from None
        except _FATAL:
            raise
        except (pynvml.NVMLError, *_VERSION_MISSING) as exc:
            _LOG.debug("%s: %s", getattr(fn, "__name__", fn), exc)
            return None

    def _read_device(self, index: int) -> GpuInfo | type[_GpuLost] | None:
        try:
            known = self._devices.get(index)
            if known is None:
                handle = self._query(pynvml.nvmlDeviceGetHandleByIndex, index)
                found = self._query(pynvml.nvmlDeviceGetUUID, handle) if handle is not None else None
                if found is None:  # UUID is the GPU's identity in every metric; without it, skip
                    _LOG.debug("GPU %d: no handle or UUID, skipped", index)
                    return None
                known = self._devices[index] = (handle, found)
            handle, uuid = known
            total, used = self._memory(handle)
            name, capability = self._fixed_fields(handle, uuid)
            return GpuInfo(
                index=index,
                uuid=uuid,
                name=name,
                memory_total_bytes=total,
                memory_used_bytes=used,
                compute_capability=capability,
                processes=self._processes(handle),
            )
        except _GpuLost:
            self._devices.pop(index, None)   # after a reset it may come back: asked afresh then
            return _GpuLost

    def _fixed_fields(self, handle: Any, uuid: str) -> tuple[str | None, tuple[int, int] | None]:
        """The GPU's name and compute capability, kept by UUID once both were read (a field the
        driver did not give is asked again next time)."""
        if uuid in self._fixed:
            return self._fixed[uuid]
        name = self._query(pynvml.nvmlDeviceGetName, handle)
        cc = self._query(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
        capability = (int(cc[0]), int(cc[1])) if cc is not None else None
        if name is not None and capability is not None:
            self._fixed[uuid] = (name, capability)
        return name, capability

    def _memory(self, handle: Any) -> tuple[int | None, int | None]:
        # v2 "used" leaves out memory the driver reserves for itself (what
        # nvidia-smi shows); v1 counts it as used. Prefer v2, fall back to v1.
        if self._memory_v2:
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                return _bytes(mem.total), _bytes(mem.used)
            except pynvml.NVMLError_GpuIsLost:
                raise _GpuLost from None
            except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_ArgumentVersionMismatch):
                self._memory_v2 = False  # driver too old for v2; stop asking
            except _FATAL:
                raise
            except pynvml.NVMLError as exc:
                _LOG.debug("nvmlDeviceGetMemoryInfo_v2: %s", exc)
        mem = self._query(pynvml.nvmlDeviceGetMemoryInfo, handle)
        return (_bytes(mem.total), _bytes(mem.used)) if mem is not None else (None, None)

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...] | None:
        procs = None
        if self._processes_v3:
            # the unversioned name is pynvml's pick (v3 today)
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except _VERSION_MISSING:
                self._processes_v3 = False
            except pynvml.NVMLError_GpuIsLost:
                raise _GpuLost from None
            except _FATAL:
                raise
            except pynvml.NVMLError as exc:
                _LOG.debug("nvmlDeviceGetComputeRunningProcesses: %s", exc)
                return None
        if not self._processes_v3:
            v2 = getattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2", None)  # not in 12.535
            procs = self._query(v2, handle) if v2 is not None else None
        if procs is None:
            return None
        # A pid can appear once per MIG compute instance: one entry per pid,
        # memory summed (None if any part is not available).
        merged: dict[int, int | None] = {}
        for proc in procs:
            used = _bytes(proc.usedGpuMemory)
            if proc.pid in merged:
                prev = merged[proc.pid]
                used = None if prev is None or used is None else prev + used
            merged[proc.pid] = used
        return tuple(GpuProcess(pid, used) for pid, used in sorted(merged.items()))


def _bytes(value: int | None) -> int | None:
    return None if value is None or value == _NOT_AVAILABLE else int(value)


_shared: dict[str | None, Nvml] = {}
_shared_lock = threading.Lock()


def shared() -> Nvml:
    """The process's one Nvml (`kvwatch run`: the preflight's device, the watchdog's GPU view and the
    exporter all read it). One per library path, which in a kvwatch process never changes."""
    path = os.environ.get(LIBRARY_ENV) or None
    with _shared_lock:
        if path not in _shared:
            _shared[path] = Nvml(path)
        return _shared[path]
