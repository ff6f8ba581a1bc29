"""The memory outside torch's allocator that vLLM's profile charges to one rank (pure, measured).

No vLLM code sizes it: cuBLAS and NCCL workspaces, NCCL's buffers at tensor parallel, and on unified
memory the host's own allocations during start-up (planner/uma_host.py). Each figure is measured on
fit runs of the public start-up logs (tests/fixtures/gpu_logs), release by release.
"""
from __future__ import annotations

from kvwatch.planner.devices import Device, GiB, card_for
from kvwatch.planner.uma_host import uma_host_bytes
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE

NON_TORCH_BYTES = int(0.125 * GiB)            # one GPU: 0.10-0.14 GiB in V1 logs
# One GPU from 0.18: 0.24-0.27 GiB on the 29 single-GPU fit runs of the llm-d sweep at 0.18.0 and 0.19.0 (the same
# box and model logs 0.13 at 0.15.0-0.17.0 and 0.25 at 0.18.0), 0.46 on its two Granite runs and 0.26 on the 0.31.0
# fit run of another source; the one fit run below it is a 16 GB card's 0.07 at 0.26.0. Measured: no vLLM code
# sizes it. Unified-memory cards add the host's term (planner/uma_host.py) on top.
NON_TORCH_ONE_GPU_BYTES = int(0.25 * GiB)
NON_TORCH_ONE_GPU_SINCE = (0, 18, 0)
NON_TORCH_TP_EXTRA_BYTES = int(0.0625 * GiB)  # tensor parallel over PCIe: NCCL's few channels' buffers
# Tensor parallel where the ranks are NVLink peers (an SXM/HGX board, nvlink_board): NCCL opens many more
# channels over NVLink than over PCIe, each with its own buffers, allocated at the profile's first collectives.
# From 0.19: 2.06-2.21 GiB per rank on the thirteen fit runs that log it at TP 2-4 (0.19.0 H100 runs of the
# llm-d sweep, 0.25 GiB at TP 1 there). Before 0.19: 0.54-0.55 GiB at TP 2 (two 0.11.0 H100 fit runs), and at
# TP 4-8 what a fit run leaves unexplained with the PCIe figure, 2.2 GiB on four H100 (vllm#21348): 0.19's
# NON_TORCH_TP_BYTES again (eight B200 at 0.13 plan within 1.1 % with it or without it once the TRT-LLM padding
# of their MXFP4 experts is counted, planner/weights.py). Over PCIe, or where NCCL finds no peer-to-peer path,
# the fit runs log 0.2 GiB or less at TP 2-8 (L40S at 0.10.2 and 0.16.0, RTX 2080 Ti at 0.8.5, A100 without
# P2P at 0.10.1) and a 0.27.1 TP-2 run on PCIe RTX PRO 6000 cards leaves no room for more: the one-GPU figure
# and a little. From 0.30 NVLink peers log what PCIe cards do: five TP-2 starts on two H100 SXM joined by NV18
# (0.30.0, torch's NCCL 2.29) plan -1.2 to -2.2 % with the one-GPU figure, as their TP-1 companions on the box
# do (-1.8 to +1.2 %), and 2.4-3.0 GiB short with 2 GiB. The releases between 0.19 and 0.30 have no NVLink
# log here and keep 0.19's figure.
NON_TORCH_TP_BYTES = int(2.0 * GiB)
NON_TORCH_TP_SINCE = (0, 19, 0)
NVLINK_SMALL_SINCE = (0, 30, 0)
NVLINK_TP2_BYTES = int(0.54 * GiB)
# Unified memory (Orin, Thor, GB10: compute capability 8.7, 11.0, 12.1, vLLM 0.13.0 vllm/utils/mem_utils.py:86;
# from 0.27 torch's is_integrated, vLLM 0.27.1 vllm/utils/mem_utils.py:148): the host's allocations during the
# profile count as non-torch memory, compiled or eager (planner/uma_host.py, measured).
UMA_CAPABILITIES = ((8, 7), (11, 0), (12, 1))


def non_torch_bytes(device: Device, tensor_parallel: int, version: VllmVersion | None, compiled: bool = True) -> int:
    """Memory outside torch's allocator that the profile charges: cuBLAS/NCCL workspaces, more on one
    CUDA GPU from 0.18 (measured, NON_TORCH_ONE_GPU_BYTES); NCCL's buffers at tensor parallel, large
    where the ranks are NVLink peers (measured, NON_TORCH_TP_BYTES); on unified memory, the host's
    allocations during start-up, more where the profile compiles the model (planner/uma_host.py, measured)."""
    parts = (version or DEFAULT_RELEASE).parts
    host = uma_host_bytes(unified_memory(device), compiled, parts)
    cuda = device.platform == "cuda"
    one_gpu = NON_TORCH_ONE_GPU_BYTES if cuda and parts >= NON_TORCH_ONE_GPU_SINCE else NON_TORCH_BYTES
    if tensor_parallel <= 1:
        return one_gpu + host
    if not (cuda and nvlink_board(device) and parts < NVLINK_SMALL_SINCE):
        return one_gpu + NON_TORCH_TP_EXTRA_BYTES + host
    two_peers_before_0_19 = tensor_parallel == 2 and parts < NON_TORCH_TP_SINCE
    return (NVLINK_TP2_BYTES if two_peers_before_0_19 else NON_TORCH_TP_BYTES) + host


def nvlink_board(device: Device) -> bool:
    """The GPUs of a tensor-parallel group are NVLink peers: an SXM part (its NVML name says SXM, as
    A100-SXM4 does) or a card sold only on SXM/HGX boards (devices.CARDS `nvlink`); never a PCIe or
    NVL (bridged PCIe) card."""
    key = device.name.lower().replace(" ", "").replace("-", "")
    if "pcie" in key or key.endswith("nvl"):
        return False
    card = card_for(device.name)
    return "sxm" in key or (card is not None and card.nvlink)


def unified_memory(device: Device) -> bool:
    """CPU and GPU share one memory: the capabilities vLLM's memory snapshot treats so, or a card the
    table marks (devices.CARDS)."""
    if device.platform != "cuda":
        return False
    card = card_for(device.name)
    return device.compute_capability in UMA_CAPABILITIES or (card is not None and card.unified_memory)
