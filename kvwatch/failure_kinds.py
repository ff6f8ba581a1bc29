"""The failure classes: stable names, used as the `kind` label of kvwatch's metrics.

Each class is fixed by a flag change (diagnosis/remedies.py), restarted as it is (ENGINE_DIED, STALLED,
KILLED, UNKNOWN within the restart budget; HOST_OOM first, then with less host memory),
or FATAL: nothing kvwatch may change fixes it, so the watchdog gives up at once (exit 78) with
vLLM's sentence and HELP's line of what a person must do.
"""
from __future__ import annotations

from enum import Enum


class FailureKind(str, Enum):
    BLOCK_SIZE_UNSUPPORTED = "block_size_unsupported"
    KV_DTYPE_UNSUPPORTED = "kv_dtype_unsupported"
    KERNEL_OUT_OF_RESOURCES = "kernel_out_of_resources"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    NO_KV_CACHE_MEMORY = "no_kv_cache_memory"
    MAMBA_CACHE_TOO_SMALL = "mamba_cache_too_small"   # max_num_seqs above a hybrid's Mamba cache blocks
    CUDA_OOM = "cuda_oom"
    GPU_MEMORY_BUSY = "gpu_memory_busy"
    NO_ATTENTION_BACKEND = "no_attention_backend"
    CONFIG_REFUSED = "config_refused"           # vLLM's own validation of its configuration said no
    LORA_RANK_TOO_LARGE = "lora_rank_too_large"  # an adapter's rank above --max-lora-rank
    NO_KERNEL_IMAGE = "no_kernel_image"          # the wheel has no kernels for this GPU's architecture
    JIT_TOOLCHAIN_MISSING = "jit_toolchain_missing"   # FlashInfer's JIT build without nvcc or ninja
    COMPILE_FAILED = "compile_failed"            # torch.compile / Inductor / Triton could not lower the model
    TOOL_PARSER_UNKNOWN = "tool_parser_unknown"  # --tool-call-parser names no parser of this release
    PLACEMENT_GROUP_UNAVAILABLE = "placement_group_unavailable"   # Ray never found the GPUs asked for
    NCCL_ERROR = "nccl_error"                    # the GPUs' collective communication failed
    PORT_IN_USE = "port_in_use"
    MODEL_UNAVAILABLE = "model_unavailable"      # gated (401), missing (404) or not cached offline
    ENGINE_DIED = "engine_died"
    KILLED = "killed"                            # ended by a signal kvwatch did not send, no other cause
    HOST_OOM = "host_oom"                        # the kernel's OOM killer ended it (the cgroup's count rose)
    STALLED = "stalled"                          # answered /health, no token with requests running
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


# Classes no flag change fixes, whatever their facts: the watchdog gives up on them at once (a port in use
# only while a process listens on it: watchdog/recovery.port_verdict).
ALWAYS_FATAL: frozenset[FailureKind] = frozenset({
    FailureKind.NO_KERNEL_IMAGE, FailureKind.JIT_TOOLCHAIN_MISSING, FailureKind.COMPILE_FAILED,
    FailureKind.TOOL_PARSER_UNKNOWN, FailureKind.PLACEMENT_GROUP_UNAVAILABLE, FailureKind.NCCL_ERROR,
    FailureKind.PORT_IN_USE, FailureKind.MODEL_UNAVAILABLE,
})

# What a person must do, for the classes kvwatch cannot fix itself (shown as "would help").
HELP: dict[FailureKind, str] = {
    FailureKind.NO_KERNEL_IMAGE: (
        "this vLLM/PyTorch build has no kernels for the GPU's architecture (e.g. a Blackwell sm_120 card "
        "on a wheel built without it): install a wheel or image built for it (CUDA 12.8+ builds for sm_100/"
        "sm_120), or build vLLM with TORCH_CUDA_ARCH_LIST naming the GPU"),
    FailureKind.JIT_TOOLCHAIN_MISSING: (
        "FlashInfer compiles kernels at start-up and cannot find nvcc or ninja: install the CUDA toolkit "
        "(nvcc on PATH or CUDA_HOME) and ninja, or the prebuilt flashinfer-cubin / flashinfer-jit-cache "
        "packages of the same version"),
    FailureKind.COMPILE_FAILED: (
        "torch.compile (Inductor/Triton) failed on this model: try -O0 or --enforce-eager by hand, "
        "or another vLLM/PyTorch/Triton version; report the lowering error upstream"),
    FailureKind.TOOL_PARSER_UNKNOWN: (
        "--tool-call-parser names a parser this vLLM release does not have: pick one from the list vLLM "
        "printed, or a release that has it (or load it with --tool-parser-plugin)"),
    FailureKind.PLACEMENT_GROUP_UNAVAILABLE: (
        "Ray never found the GPUs the engine asks for: check `ray status`, join the missing nodes, or "
        "use a --tensor-parallel-size x --pipeline-parallel-size the cluster has"),
    FailureKind.NCCL_ERROR: (
        "the GPUs could not talk to each other (NCCL): check the driver/NCCL versions, shared memory "
        "(--ipc=host or a larger /dev/shm), P2P/NVLink and the network; rerun with NCCL_DEBUG=INFO"),
    FailureKind.PORT_IN_USE: (
        "the address vLLM binds is taken: stop the process holding it, or give the engine another --port"),
    FailureKind.MODEL_UNAVAILABLE: (
        "the model cannot be fetched: a gated model needs an accepted licence and a token (HF_TOKEN); "
        "check the repository id or local path; offline (HF_HUB_OFFLINE=1) it must be in the cache"),
}


# Classes the watchdog names from what it measures, not from the engine's output: no log shows them.
MEASURED: frozenset[FailureKind] = frozenset({FailureKind.STALLED, FailureKind.KILLED, FailureKind.HOST_OOM})
