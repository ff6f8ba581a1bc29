"""The host memory a unified-memory GPU's profile charges as non-torch memory, by compilation (pure).

On unified memory (Orin, Thor, GB10) vLLM's memory snapshot reads free memory as the host's
psutil.virtual_memory().available (vLLM 0.13.0, vllm/utils/mem_utils.py:86-102; 0.20.2 :109-116), and
the profile's non-torch figure is the growth of (total - free - torch reserved) from the worker's first
snapshot to the profile's end (0.13.0 mem_utils.py:225; 0.20.2 :268). So whatever the process and its
children allocate on the host in that span comes out of the KV budget.

Most of it is compilation. The profile run is the model's first forward pass (0.13.0
v1/worker/gpu_worker.py:336-340; 0.20.2 :366-370; "a profile run which compiles the model", :312-314 and
:345-347): under vLLM's compilation mode the model's first call runs Dynamo and Inductor there
(0.13.0 vllm/compilation/decorators.py:367), with Inductor's compile workers and the Triton kernels it
builds, all host memory. With compilation off the call is the plain forward (decorators.py:298-305:
mode NONE skips it), and only the rest is left: the CUDA context, cuBLAS and the loader's host-side
buffers. CUDA graphs are captured after the KV cache is sized (compile_or_warm_up_model), so not here.

Compilation is off under --enforce-eager (0.11.2 config/vllm.py:440-444: mode NONE where unset; with
optimization level 0 from 0.12: 0.13.0 config/vllm.py:617-623, :652-656; 0.20.2 :895-900 whatever the mode), under
--optimization-level 0 (0.12+), and where --compilation-config sets mode (0.11.2+) or level (before) 0.

Neither size is any code's; both are measured from GB10 start-up logs of fit runs:
- compiled: 1.47 and 1.90 GiB beyond the 0.125 GiB one-GPU non-torch term of 0.13 on the two GB10 fit runs of vLLM 0.13.0
  in NVIDIA's 26.01 container (search_qwen25_14b_fp8_gb10_v0130, search_qwen3_30b_a3b_fp8_gb10_v0130),
  their mean;
- eager: the one eager GB10 start-up, search_qwen25_15b_gb10_u004_v0201 (vLLM 0.20.1 in NVIDIA's 26.05
  container, --enforce-eager, a fit run by run and by source): its logged 0.56 GiB of KV leaves
  121.69 x 0.04 - 2.88 (weights) - 0.55 (activation, as planned) - 0.56 - 0.25 (the one-GPU non-torch
  term from 0.18, non_torch.NON_TORCH_ONE_GPU_BYTES) = 0.63 GiB for the host.
  No held-out run was looked at for it.
"""
from __future__ import annotations

from kvwatch.planner.devices import GiB

UMA_HOST_COMPILED_BYTES = int(1.68 * GiB)
UMA_HOST_EAGER_BYTES = int(0.63 * GiB)
# The rule is absent from 0.11.0 and present in 0.11.2 (the first release seen with it).
UMA_FREE_FROM_PSUTIL_SINCE = (0, 11, 2)


def uma_host_bytes(unified: bool, compiled: bool, release: tuple[int, int, int]) -> int:
    """The host's allocations the profile counts as non-torch memory: none off unified memory or
    before psutil's figure; otherwise the compiled or the eager measurement."""
    if not unified or release < UMA_FREE_FROM_PSUTIL_SINCE:
        return 0
    return UMA_HOST_COMPILED_BYTES if compiled else UMA_HOST_EAGER_BYTES
