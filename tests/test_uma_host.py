"""The unified-memory host term by device kind, compilation and release (planner/uma_host.py)."""
from __future__ import annotations

import pytest

from kvwatch.planner.devices import Device, GiB
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.gpu_budget import profile_key
from kvwatch.planner.non_torch import NON_TORCH_BYTES, NON_TORCH_ONE_GPU_BYTES, non_torch_bytes
from kvwatch.planner.uma_host import UMA_HOST_COMPILED_BYTES, UMA_HOST_EAGER_BYTES, uma_host_bytes
from kvwatch.values.versions import parse_version

GB10 = Device("cuda", "NVIDIA GB10", (12, 1), int(121.69 * GiB))
THOR = Device("cuda", "NVIDIA Thor", (11, 0), 128 * GiB)
ORIN = Device("cuda", "Orin", (8, 7), 64 * GiB)
H100 = Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB)


@pytest.mark.parametrize("device,compiled,version,host", [
    (GB10, True, "0.13.0", UMA_HOST_COMPILED_BYTES),    # the two compiled GB10 fit runs
    (GB10, False, "0.13.0", UMA_HOST_EAGER_BYTES),
    (GB10, False, "0.20.2", UMA_HOST_EAGER_BYTES),      # the eager GB10 fit run
    (GB10, True, "0.20.2", UMA_HOST_COMPILED_BYTES),
    (THOR, True, "0.27.1", UMA_HOST_COMPILED_BYTES),
    (ORIN, False, "0.11.2", UMA_HOST_EAGER_BYTES),      # the first release seen reading psutil
    (GB10, True, "0.11.0", 0),                          # before it: CUDA's free memory, no host term
    (GB10, False, "0.11.0", 0),
    (H100, True, "0.20.2", 0),                          # discrete memory
    (H100, False, "0.20.2", 0),
])
def test_the_host_term_follows_the_device_kind_compilation_and_release(device: Device, compiled: bool, version: str,
                                                                        host: int) -> None:
    one_gpu = NON_TORCH_ONE_GPU_BYTES if parse_version(version).parts >= (0, 18, 0) else NON_TORCH_BYTES
    assert non_torch_bytes(device, 1, parse_version(version), compiled) == one_gpu + host


def test_eager_charges_less_host_memory_than_compiled() -> None:
    assert 0 < UMA_HOST_EAGER_BYTES < UMA_HOST_COMPILED_BYTES
    assert uma_host_bytes(True, False, (0, 20, 2)) == UMA_HOST_EAGER_BYTES


@pytest.mark.parametrize("flags,release,off", [
    ([], "0.13.0", False),
    (["--enforce-eager"], "0.20.2", True),
    (["--optimization-level", "0"], "0.13.0", True),
    (["--optimization-level", "3"], "0.13.0", False),
    (["--compilation-config", '{"mode": 0}'], "0.20.2", True),
    (["--compilation-config", '{"mode": 3}'], "0.20.2", False),
    (["--compilation-config", '{"level": 0}'], "0.11.2", True),
    (["-O0"], "0.10.2", True),                       # before 0.12, -O is --compilation-config: level 0
    (["-O3"], "0.10.2", False),
    (["--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}'], "0.20.2", False),
])
def test_the_command_says_whether_vllm_compiles(flags: list[str], release: str, off: bool) -> None:
    settings = EngineCommand.parse(["vllm", "serve", "Qwen/Qwen2.5-1.5B-Instruct", *flags], release).settings()
    assert settings.compilation_off is off


def test_a_profile_without_compilation_learns_apart_from_a_compiled_one() -> None:
    """-O 0 changes vLLM's profile run, so a figure learned from it is not a compiled run's; the keys learned
    without the flag are unchanged."""
    def key(*flags: str) -> str:
        s = EngineCommand.parse(["vllm", "serve", "Qwen/Qwen2.5-1.5B-Instruct", *flags], "0.20.2").settings()
        return profile_key(s, GB10, parse_version("0.20.2"))
    assert key("--optimization-level", "0") != key() == key("--optimization-level", "3")
    assert key("--enforce-eager") != key()
