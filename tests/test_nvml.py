"""kvwatch.boundary.nvml through the real nvidia-ml-py, loading the stand-in libnvidia-ml.so.1.

Nothing here is mocked: pynvml calls into the compiled fake driver, whose
state file each test rewrites (see tests/nvml_standin/).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from nvml_standin import (
    GIB,
    NvmlStandin,
    StandinGpu,
    StandinProcess,
    StandinState,
)

from kvwatch.boundary.nvml import Nvml
from kvwatch.gpu_types import GpuInfo, GpuProcess, parse_cuda_visible_devices

A100 = "GPU-0f1e2d3c-aaaa-4bbb-8ccc-000000000000"
L40S = "GPU-9a8b7c6d-dddd-4eee-8fff-111111111111"
ROOT = Path(__file__).resolve().parents[1]


def two_gpus(**overrides: object) -> StandinState:
    a100 = StandinGpu(uuid=A100, name="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GIB,
                      memory_used_bytes=30 * GIB, memory_reserved_bytes=512 << 20,
                      compute_capability=(8, 0),
                      processes=[StandinProcess(4242, 20 * GIB), StandinProcess(777, 10 * GIB)])
    l40s = StandinGpu(uuid=L40S, name="NVIDIA L40S", memory_total_bytes=48 * GIB,
                      memory_used_bytes=1 * GIB, compute_capability=(8, 9),
                      processes=[StandinProcess(5150, None)])
    gpus = [a100, l40s]
    for key, value in overrides.items():  # e.g. gpu1_lost=True -> gpus[1].lost = True
        index, attr = key.split("_", 1)
        setattr(gpus[int(index.removeprefix("gpu"))], attr, value)
    return StandinState(gpus=gpus, driver_version="570.124.06")


@pytest.fixture
def nvml(nvml_standin: NvmlStandin) -> Iterator[Nvml]:
    nvml_standin.write(two_gpus())
    with Nvml() as handle:  # library path from KVWATCH_NVML_LIBRARY, set by the fixture
        yield handle


def test_two_gpus_with_their_memory_capability_and_processes(nvml: Nvml) -> None:
    snap = nvml.snapshot()
    assert snap.available and snap.error is None
    assert snap.driver_version == "570.124.06"
    assert snap.lost_gpus == ()
    a100, l40s = snap.gpus
    assert a100 == GpuInfo(index=0, uuid=A100, name="NVIDIA A100-SXM4-80GB",
                           # v2 semantics: the 512 MiB reserved are not "used"
                           memory_total_bytes=80 * GIB, memory_used_bytes=30 * GIB,
                           compute_capability=(8, 0),
                           processes=(GpuProcess(777, 10 * GIB), GpuProcess(4242, 20 * GIB)))
    assert (l40s.index, l40s.uuid, l40s.compute_capability) == (1, L40S, (8, 9))
    assert (l40s.memory_total_bytes, l40s.memory_used_bytes) == (48 * GIB, 1 * GIB)
    assert l40s.processes == (GpuProcess(5150, None),)  # NVML_VALUE_NOT_AVAILABLE -> None


def test_is_lazy_and_uses_the_versioned_calls_pynvml_picks(nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(two_gpus())
    nvml = Nvml()
    assert nvml_standin.calls() == []  # constructing it touches nothing
    nvml.snapshot()
    calls = nvml_standin.calls()
    assert calls[0] == "nvmlInitWithFlags"
    assert {"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3"} <= set(calls)
    nvml.snapshot()
    assert nvml_standin.calls().count("nvmlInitWithFlags") == 1  # initialized once
    nvml.shutdown()
    assert nvml_standin.calls()[-1] == "nvmlShutdown"


def test_reinitializes_after_shutdown(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    assert nvml.snapshot().available
    nvml.shutdown()
    nvml.shutdown()  # idempotent
    snap = nvml.snapshot()
    assert snap.available and len(snap.gpus) == 2
    assert nvml_standin.calls().count("nvmlInitWithFlags") == 2
    assert nvml_standin.calls().count("nvmlShutdown") == 1


def test_a_process_that_leaves_is_gone_next_time(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    assert [p.pid for p in nvml.snapshot().gpus[0].processes or ()] == [777, 4242]
    nvml_standin.write(two_gpus(gpu0_processes=[StandinProcess(4242, 20 * GIB)],
                                gpu1_processes=[]))
    a100, l40s = nvml.snapshot().gpus
    assert a100.processes == (GpuProcess(4242, 20 * GIB),)
    assert l40s.processes == ()  # none running, as opposed to None (not available)


@pytest.mark.parametrize("call", ["memory", "memory_v1"])
def test_memory_not_supported_is_none(nvml: Nvml, nvml_standin: NvmlStandin, call: str) -> None:
    nvml_standin.write(two_gpus(gpu1_errors={call: "NOT_SUPPORTED", "memory_v2": "NOT_SUPPORTED"}))
    a100, l40s = nvml.snapshot().gpus
    assert (l40s.memory_total_bytes, l40s.memory_used_bytes) == (None, None)
    assert l40s.compute_capability == (8, 9) and l40s.processes == (GpuProcess(5150, None),)
    assert a100.memory_used_bytes == 30 * GIB


def test_processes_not_supported_is_none(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(two_gpus(gpu0_errors={"processes": "NOT_SUPPORTED"}))
    a100, l40s = nvml.snapshot().gpus
    assert a100.processes is None
    assert a100.memory_total_bytes == 80 * GIB
    assert l40s.processes == (GpuProcess(5150, None),)


def test_other_field_errors_are_not_available(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(two_gpus(gpu0_errors={"name": "NO_PERMISSION", "cc": "NOT_FOUND"}))
    a100 = nvml.snapshot().gpus[0]
    assert (a100.name, a100.compute_capability) == (None, None)
    assert a100.uuid == A100


def test_memory_falls_back_to_v1_when_the_driver_lacks_v2(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(two_gpus(gpu0_errors={"memory_v2": "ARGUMENT_VERSION_MISMATCH"},
                                gpu1_errors={"memory_v2": "ARGUMENT_VERSION_MISMATCH"}))
    a100 = nvml.snapshot().gpus[0]
    assert a100.memory_used_bytes == 30 * GIB + (512 << 20)  # v1 counts reserved as used
    nvml_standin.clear_calls()
    nvml.snapshot()
    calls = nvml_standin.calls()
    assert "nvmlDeviceGetMemoryInfo_v2" not in calls and "nvmlDeviceGetMemoryInfo" in calls


def test_processes_fall_back_to_v2(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    # FUNCTION_NOT_FOUND is what pynvml reports for a symbol the driver lacks
    nvml_standin.write(two_gpus(gpu0_errors={"processes_v3": "FUNCTION_NOT_FOUND"}))
    a100, l40s = nvml.snapshot().gpus
    if not hasattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2"):  # nvidia-ml-py 12.535
        assert a100.processes is None and l40s.processes is None
        return
    assert a100.processes == (GpuProcess(777, 10 * GIB), GpuProcess(4242, 20 * GIB))
    assert l40s.processes == (GpuProcess(5150, None),)
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in nvml_standin.calls()


@pytest.mark.parametrize("how", [{"gpu1_lost": True}, {"gpu1_errors": {"processes": "GPU_IS_LOST"}}],
                         ids=["every-call", "mid-read"])
def test_a_lost_gpu_is_listed_the_other_reports(nvml: Nvml, nvml_standin: NvmlStandin, how: dict) -> None:
    nvml_standin.write(two_gpus(**how))
    snap = nvml.snapshot()
    assert snap.available
    assert snap.lost_gpus == (1,)
    assert [g.uuid for g in snap.gpus] == [A100]
    assert snap.gpus[0].processes == (GpuProcess(777, 10 * GIB), GpuProcess(4242, 20 * GIB))
    assert nvml.device(1) is None
    nvml_standin.write(two_gpus())  # back after a reset
    assert [g.index for g in nvml.snapshot().gpus] == [0, 1]


def test_init_failure_is_unavailable_with_the_error_then_recovers(nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(StandinState(gpus=two_gpus().gpus, init_error="DRIVER_NOT_LOADED"))
    with Nvml() as nvml:
        snap = nvml.snapshot()
        assert not snap.available
        assert snap.error == "nvmlInit: Driver Not Loaded"
        assert (snap.gpus, snap.lost_gpus, snap.driver_version) == ((), (), None)
        assert nvml.device(0) is None and nvml.visible_device(None) is None
        nvml_standin.write(two_gpus())  # the driver is loaded now
        assert nvml.snapshot().available


def test_a_global_failure_mid_flight_is_unavailable(nvml: Nvml, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(StandinState(gpus=two_gpus().gpus, errors={"count": "LIB_RM_VERSION_MISMATCH"}))
    snap = nvml.snapshot()
    assert not snap.available and "version mismatch" in (snap.error or "")
    nvml_standin.write(two_gpus())
    assert nvml.snapshot().available


def test_reinitializes_when_someone_else_shut_nvml_down(nvml: Nvml) -> None:
    assert nvml.snapshot().available
    # Shutdowns elsewhere in the process until NVML is down: as many as there were inits (an earlier
    # test's supervisor may still hold one), plus the one too many.
    while True:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError_Uninitialized:
            break
    snap = nvml.snapshot()
    assert (snap.available, snap.error) == (False, "NVML: Uninitialized")
    assert nvml.snapshot().available  # init again on the next tick


def test_device_by_index(nvml: Nvml) -> None:
    gpu = nvml.device(1)
    assert gpu is not None and gpu.uuid == L40S
    assert nvml.device(2) is None


@pytest.mark.parametrize(("value", "uuid"), [
    (None, A100), ("1", L40S), ("1,0", L40S), (" 1 ", L40S), ("GPU-9a8b", L40S), (A100, A100),
    ("", None), ("2", None), ("-1,1", None), ("GPU-0f1e,1", A100), ("GPU-ffff", None),
    ("1,GPU-9a8b", None),  # the same GPU twice: CUDA sees none
])
def test_visible_device(nvml: Nvml, value: str | None, uuid: str | None) -> None:
    gpu = nvml.visible_device(value)
    assert (gpu.uuid if gpu else None) == uuid


def test_parse_cuda_visible_devices() -> None:
    devices = {0: "GPU-aa11", 1: "GPU-aa22", 2: None}  # 2: lost, UUID unknown
    assert parse_cuda_visible_devices(None, devices) == [0, 1, 2]
    assert parse_cuda_visible_devices("", devices) == []
    assert parse_cuda_visible_devices("2,0", devices) == [2, 0]
    assert parse_cuda_visible_devices("1gpu,0", devices) == [1, 0]  # strtoul reads the digits
    assert parse_cuda_visible_devices("0,7,1", devices) == [0]  # unknown index ends the list
    assert parse_cuda_visible_devices("0,,1", devices) == [0]
    assert parse_cuda_visible_devices("GPU-aa", devices) == []  # ambiguous prefix
    assert parse_cuda_visible_devices("GPU-aa2,0", devices) == [1, 0]
    assert parse_cuda_visible_devices("0,1,0", devices) == []
    assert parse_cuda_visible_devices("MIG-1234", devices) == []


def test_concurrent_snapshots_are_consistent(nvml: Nvml) -> None:
    results: list[int] = []

    def worker() -> None:
        for _ in range(20):
            snap = nvml.snapshot()
            results.append(len(snap.gpus) if snap.available else -1)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [2] * 120


CHILD = """
import json, sys
from kvwatch.boundary.nvml import Nvml
snap = Nvml(*sys.argv[1:]).snapshot()
print(json.dumps({"available": snap.available, "error": snap.error,
                  "uuids": [g.uuid for g in snap.gpus]}))
"""


def run_child(env: dict[str, str], *args: str) -> dict:
    env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_child_process_loads_the_library_from_the_env(nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(two_gpus())
    assert run_child(nvml_standin.env) == {"available": True, "error": None, "uuids": [A100, L40S]}


def test_a_library_that_does_not_load_is_unavailable(nvml_standin: NvmlStandin, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-libnvidia-ml.so.1")
    result = run_child(nvml_standin.env, missing)
    assert not result["available"]
    assert result["error"].startswith(f"cannot load NVML library {missing}")


def test_a_gpus_name_and_capability_are_read_once_per_init(nvml_standin: NvmlStandin,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """They are the card's (by UUID): each tick reads memory and processes, not them; a new init
    (after a shutdown: the driver may have changed) reads them again."""
    asked: list[str] = []
    for call in ("nvmlDeviceGetName", "nvmlDeviceGetCudaComputeCapability"):
        real = getattr(pynvml, call)
        monkeypatch.setattr(pynvml, call, lambda handle, _real=real, _call=call: asked.append(_call) or _real(handle))
    nvml_standin.write(two_gpus())
    with Nvml() as nvml:
        first = nvml.snapshot()
        nvml_standin.write(two_gpus(gpu0_memory_used_bytes=40 * GIB))
        second = nvml.snapshot()
        assert second.gpus[0].memory_used_bytes == 40 * GIB
        assert [(g.name, g.compute_capability) for g in second.gpus] == \
            [(g.name, g.compute_capability) for g in first.gpus] == [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA L40S", (8, 9))]
        assert len(asked) == 4   # two GPUs, two calls each, once
        nvml.shutdown()
        nvml.snapshot()
        assert len(asked) == 8


def test_a_gpus_handle_uuid_and_the_driver_version_are_read_once_per_init(nvml_standin: NvmlStandin) -> None:
    """NVML enumerates the devices at init and a handle stays its device's until shutdown: a tick asks
    each GPU for its memory and processes only. A GPU that answers GPU_IS_LOST, a change in the device
    count and a new init ask again."""
    def asked() -> list[str]:
        return [c for c in nvml_standin.calls() if c.startswith(("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
                                                                   "nvmlSystemGetDriverVersion"))]
    nvml_standin.write(two_gpus())
    with Nvml() as nvml:
        first = nvml.snapshot()
        assert len(asked()) == 5   # two GPUs, two calls each, and the driver once
        nvml_standin.write(two_gpus(gpu1_memory_used_bytes=7 * GIB))
        second = nvml.snapshot()
        assert len(asked()) == 5
        assert [g.uuid for g in second.gpus] == [g.uuid for g in first.gpus] == [A100, L40S]
        assert second.gpus[1].memory_used_bytes == 7 * GIB and second.driver_version == "570.124.06"
        nvml_standin.write(two_gpus(gpu1_lost=True))
        assert nvml.snapshot().lost_gpus == (1,)
        nvml_standin.write(two_gpus())   # back after a reset: its handle and UUID are asked again
        nvml_standin.clear_calls()
        assert [g.uuid for g in nvml.snapshot().gpus] == [A100, L40S]
        assert len(asked()) == 2
        nvml_standin.clear_calls()
        nvml_standin.write(StandinState(gpus=two_gpus().gpus[1:], driver_version="570.124.06"))
        assert [g.uuid for g in nvml.snapshot().gpus] == [L40S]   # one device now, at index 0
        assert len(asked()) == 2
        nvml.shutdown()
        nvml_standin.clear_calls()
        nvml.snapshot()
        assert len(asked()) == 3
