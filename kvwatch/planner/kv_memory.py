"""The memory vLLM gives the KV cache, as the plan predicts it (pure): a flag or the environment fixes
it, else the non-KV memory learned on an earlier launch, else vLLM's own profile of the card estimated
(planner/gpu_budget.py); and, when no block fits, the flag that frees one."""
from __future__ import annotations

from dataclasses import dataclass, replace

from kvwatch.planner.devices import Device, GiB
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.extensible_kv import effective_utilization
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.gpu_budget import GpuBudget, decoder_layer_bytes, estimate_budget, expert_parallel
from kvwatch.planner.lora_slots import LoraSlots, lora_slots
from kvwatch.planner.pooling_run import NO_LM_HEAD_SINCE, lm_head_params, run_of
from kvwatch.planner.predicted_refusal import NO_KV_CACHE_MEMORY, PredictedRefusal
from kvwatch.planner.tower_skip import loaded_count
from kvwatch.planner.weights import (
    gpu_weights_bytes,
    mla_absorbed_bytes,
    mxfp4_padding_bytes,
    mxfp4_triton_hopper_bytes,
    replicated_linear_bytes,
)
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.moe_kernels import marlin_asked, moe_backend_asked, quantized_experts_keep_workspace
from kvwatch.vllm_releases.release_defaults import defaults_for


@dataclass(frozen=True)
class MemoryInputs:
    """What decides the KV memory, gathered by the caller (environment, NVML, state file)."""

    cpu_kv_space_bytes: int | None = None    # VLLM_CPU_KVCACHE_SPACE, in bytes
    weights_bytes: int | None = None         # weight files on disk
    non_kv_bytes: int | None = None          # measured on an earlier run of this engine
    vllm_version: VllmVersion | None = None  # the vLLM the plan is for (None: the newest kvwatch knows)
    vllm_env: tuple[tuple[str, str], ...] = ()   # the environment variables its memory profile reads
    flashinfer_installed: bool | None = None  # FlashInfer beside that vLLM (None: not known)
    sentence_transformers_pooling: bool = False   # modules.json names a Pooling module (planner/pooling_run.py)
    lm_head_file_bytes: int = 0              # the LM head tensors among the weight files


NO_MEMORY_INPUTS = MemoryInputs()   # nothing measured: the planner's own defaults


def _gpu_budget(device: Device, settings: EngineSettings, geometry: ModelGeometry, memory: MemoryInputs,
                model_bytes: int, max_model_len: int, backend: str | None = None,
                lora: LoraSlots | None = None) -> GpuBudget:
    """GPU: vLLM's own split of the card (planner/gpu_budget.py): total x utilization, minus the
    weights, the profile's activation peak, non-torch memory and, where the release counts them, CUDA graphs.
    `backend`: the attention backend the plan picks (TRITON_MLA claims a decode workspace in the profile)."""
    ranks = settings.tensor_parallel_size * settings.pipeline_parallel_size
    # the MoE kernel the environment asks for where the flag does not (vllm_releases/moe_kernels.py)
    settings = replace(settings, moe_backend=moe_backend_asked(
        settings.moe_backend, geometry.quantization, dict(memory.vllm_env),
        (memory.vllm_version or DEFAULT_RELEASE).parts, device.compute_capability if device.platform == "cuda" else None))
    # a vision tower the flags leave unbuilt loads no weights and profiles no encoder (planner/tower_skip.py)
    loaded = loaded_count(geometry.weight_count, settings, (memory.vllm_version or DEFAULT_RELEASE).parts)
    unbuilt_tower = (geometry.weight_count.vision_params - loaded.vision_params) * model_bytes \
        if geometry.weight_count is not None and loaded is not None else 0
    geometry = replace(geometry, weight_count=loaded)
    weights = _weights_from_files(geometry, settings, memory, device, model_bytes) - unbuilt_tower if memory.weights_bytes is not None \
        else _weights_from_geometry(geometry, model_bytes, settings, device, memory)
    weights = (weights + _kernel_format_bytes(geometry, settings, device, memory.vllm_version, weights,
                                              model_bytes)) // ranks
    weights += (lora or _lora_slots(geometry, settings, memory, model_bytes)).bytes_per_rank
    return estimate_budget(settings, device, geometry.weight_count, weights, model_bytes, max_model_len,
                           memory.vllm_version, dict(memory.vllm_env), memory.flashinfer_installed,
                           experts_without_workspace=_experts_without_workspace(geometry, settings, device, memory),
                           mla=geometry.attention == "mla",
                           replicated_linear_bytes=replicated_linear_bytes(geometry.weight_count, geometry.quantization,
                                                                           model_bytes, settings.quantization)
                           if geometry.weight_count is not None else 0,
                           architectures=geometry.architectures, hybrid="mamba" in geometry.layer_kinds,
                           backend=backend, sentence_transformers=memory.sentence_transformers_pooling,
                           mla_heads_and_rank=(geometry.num_attention_heads or 0, geometry.kv_lora_rank or 0)
                           if geometry.attention == "mla" else (0, 0),
                           quantized=geometry.quantization is not None or settings.quantization is not None)


def _lora_slots(geometry: ModelGeometry, settings: EngineSettings, memory: MemoryInputs, model_bytes: int) -> LoraSlots:
    """The adapter slots --enable-lora allocates on a rank with the weights (planner/lora_slots.py)."""
    if not settings.enable_lora:
        return LoraSlots(0, True)
    dtype_bytes = model_bytes if (settings.lora_dtype or "auto") == "auto" else 2   # bfloat16 or float16
    slots = lora_slots(geometry.weight_count, settings.max_loras, settings.max_lora_rank, dtype_bytes,
                       settings.tensor_parallel_size, expert_parallel(settings),
                       (memory.vllm_version or DEFAULT_RELEASE).parts)
    covered = slots.covered and geometry.attention == "full" and "mamba" not in geometry.layer_kinds \
        and not settings.fully_sharded_loras
    return LoraSlots(slots.bytes_per_rank, covered, slots.in_budget)


def _experts_without_workspace(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                               memory: MemoryInputs) -> bool:
    """Quantized experts whose kernel keeps no workspaces in the profile; block-FP8 experts on the Triton
    kernel and Marlin's keep them (vllm_releases/moe_kernels.py)."""
    if geometry.quantization is None:
        # unquantized experts keep them; those the engine quantizes itself (--quantization): kernels not read
        return settings.quantization is not None
    if device.platform != "cuda":
        return True
    return not quantized_experts_keep_workspace(geometry.quantization, device.compute_capability, expert_parallel(settings),
                                                (memory.vllm_version or DEFAULT_RELEASE).parts, settings.moe_backend)


def _estimate_gpu_kv_memory(device: Device, settings: EngineSettings, geometry: ModelGeometry,
                            memory: MemoryInputs, model_bytes: int, backend: str | None = None) -> int:
    """The KV memory on a GPU: learned from an earlier launch's non-KV memory, else estimated."""
    budget = _gpu_budget(device, settings, geometry, memory, model_bytes,
                         settings.max_model_len or geometry.default_max_model_len, backend)
    if memory.non_kv_bytes is not None:
        return max(0, budget.requested_bytes - memory.non_kv_bytes)
    return budget.kv_cache_bytes


def _kernel_format_bytes(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                         version: VllmVersion | None, weights: int, model_bytes: int) -> int:
    """What the kernels' weight formats add to the checkpoint's `weights` (all ranks) once loaded:
    MXFP4 experts under the Triton backend on Hopper (weights.mxfp4_triton_hopper_bytes); V0 0.7.x's
    absorbed MLA matrices (weights.mla_absorbed_bytes, per rank: times the ranks)."""
    count = geometry.weight_count
    if count is None:
        return 0
    parts = (version or DEFAULT_RELEASE).parts
    method = str((geometry.quantization or {}).get("quant_method", "")).lower()
    if geometry.attention == "mla" and device.platform == "cuda":
        fp8 = method == "fp8" or settings.quantization == "fp8"
        ranks = settings.tensor_parallel_size * settings.pipeline_parallel_size
        absorbed = ranks * mla_absorbed_bytes(count, settings.tensor_parallel_size, model_bytes, fp8, parts)
        if absorbed and settings.cpu_offload_gb > 0:
            # made from the layer's own weights, so they stay in host memory with an offloaded layer
            layers = decoder_layer_bytes(weights, count, model_bytes)
            moved = min(1.0, settings.cpu_offload_gb * GiB * ranks / layers) if layers > 0 else 1.0
            absorbed = int(absorbed * (1.0 - moved))
        return absorbed
    if method != "mxfp4" or marlin_asked(settings.moe_backend):   # Marlin's padding is in the weights
        return 0
    return mxfp4_triton_hopper_bytes(count, settings.tensor_parallel_size, device.compute_capability, parts)


def _weights_from_files(geometry: ModelGeometry, settings: EngineSettings, memory: MemoryInputs, device: Device,
                        model_bytes: int) -> int:
    """The weight files' tensors, less the LM head a model converted to pooling never allocates, plus the
    padding an MXFP4 MoE kernel allocates them with (what config.json's count carries too)."""
    weights = memory.weights_bytes or 0
    version = memory.vllm_version or DEFAULT_RELEASE
    run = run_of(settings, geometry.architectures, version, memory.sentence_transformers_pooling)
    if run.converted and version.parts >= NO_LM_HEAD_SINCE:
        weights -= memory.lm_head_file_bytes
    if geometry.weight_count is not None:
        weights += mxfp4_padding_bytes(geometry.weight_count, geometry.quantization, model_bytes,
                                       settings.tensor_parallel_size, device.compute_capability, settings.moe_backend,
                                       version.parts)
    return weights


def _weights_from_geometry(geometry: ModelGeometry, model_bytes: int, settings: EngineSettings, device: Device,
                           memory: MemoryInputs) -> int:
    """The weights from config.json's shapes and quantization_config (or `--quantization`); their
    files, when present, win (MemoryInputs.weights_bytes). A model vLLM converts to a pooling model
    loads no LM head (planner/pooling_run.py)."""
    count = geometry.weight_count
    if count is None:
        return 0
    version = memory.vllm_version or DEFAULT_RELEASE
    run = run_of(settings, geometry.architectures, version, memory.sentence_transformers_pooling)
    head = lm_head_params(run, count.vocab_size, count.hidden_size, count.embedding_params, version.parts)
    if head:
        count = replace(count, embedding_params=count.embedding_params - head)
    return gpu_weights_bytes(count, geometry.quantization, model_bytes,
                             settings.quantization, settings.model, settings.tensor_parallel_size,
                             device.compute_capability, settings.moe_backend, version.parts)


def kv_memory(device: Device, settings: EngineSettings, geometry: ModelGeometry, memory: MemoryInputs,
               model_bytes: int, backend: str | None = None) -> tuple[int, str, bool, GpuBudget | None]:
    """The memory given to the KV cache, where it comes from, whether it is estimated, and the GPU
    budget it was estimated from: a flag or the environment fixes it, else the learned non-KV
    memory, else vLLM's own profile estimated (for the attention `backend` the plan picks)."""
    if device.platform == "cpu" and memory.cpu_kv_space_bytes:
        return memory.cpu_kv_space_bytes, "VLLM_CPU_KVCACHE_SPACE", False, None
    if settings.kv_cache_memory_bytes is not None:
        return settings.kv_cache_memory_bytes, "--kv-cache-memory-bytes", False, None
    if device.platform == "cuda" and device.total_memory_bytes and memory.non_kv_bytes is not None:
        return (_estimate_gpu_kv_memory(device, settings, geometry, memory, model_bytes, backend),
                "learned: total x utilization - the non-KV memory of an earlier launch", False, None)
    if device.platform == "cuda" and device.total_memory_bytes:
        lora = _lora_slots(geometry, settings, memory, model_bytes)   # once: the weights and the note
        budget = _gpu_budget(device, settings, geometry, memory, model_bytes,
                             settings.max_model_len or geometry.default_max_model_len, backend, lora)
        how = "estimate: total x utilization - weights - activation - non-torch" if budget.extensible is None else \
            ("estimate: sized after warm-up (extensible KV cache): min(total x utilization, free at start - margin) "
             "- weights - non-torch - CUDA graphs - the transient peak")
        if settings.enable_lora:
            how += "; " + _lora_note(lora)
        return budget.kv_cache_bytes, how, True, budget
    return 4 * GiB, "estimate: unknown device memory", True, None


def _lora_note(slots: LoraSlots) -> str:
    """What the estimate of a LoRA engine counts of the adapters, and what it leaves out."""
    if not slots.in_budget:
        return "--enable-lora: the release allocates the adapter slots outside its budget (before 0.8), so they are not counted"
    counted = f"--enable-lora: {slots.bytes_per_rank / GiB:.2f} GiB of adapter slots counted with the weights"
    if slots.covered:
        return counted + "; the LoRA kernels' share of the profile is not"
    return (counted + " (the dense layers' and routed experts' only); the other layers' slots (attention and "
            "shared experts of MoE, MLA and Mamba models) and the LoRA profile are not, so the estimate is high by their size")


def no_memory_warning(device: Device, settings: EngineSettings, geometry: ModelGeometry,
                      memory: MemoryInputs, model_bytes: int, kv_memory: int, bytes_per_block: int,
                      estimated: bool, budget: GpuBudget | None, backend: str | None = None) -> PredictedRefusal:
    """No KV block fits, and the flag that frees one: `budget` is the estimated split the KV memory
    came from (None: a flag, the CPU's space or a learned figure set it)."""
    message = f"no memory is left for KV cache blocks ({kv_memory:,} B for {bytes_per_block:,} B per block)"
    if settings.kv_cache_memory_bytes is not None:   # the flag sets the KV memory: no other flag moves it
        return PredictedRefusal(NO_KV_CACHE_MEMORY, message + "; --kv-cache-memory-bytes sets it: raise it",
                                NO_CHANGE, certain=not estimated)
    current = effective_utilization(settings, device.platform, defaults_for(memory.vllm_version or DEFAULT_RELEASE))
    if device.platform == "cuda" and device.total_memory_bytes and current < 0.95:
        higher = replace(settings, gpu_memory_utilization=0.95, gpu_memory_utilization_given=True)
        if _estimate_gpu_kv_memory(device, higher, geometry, memory, model_bytes, backend) >= 2 * bytes_per_block:
            return PredictedRefusal(NO_KV_CACHE_MEMORY, message, FlagChange({"--gpu-memory-utilization": 0.95}),
                            certain=not estimated)
    # The profile's peak grows with its dummy sequences (the sampler's logits; V0 Llama 3.2 Vision's
    # one image each): the most sequences, halving, that leave the KV cache two blocks.
    seqs = budget.max_num_seqs if budget is not None else 1
    while seqs > 1:
        seqs //= 2
        fewer = replace(settings, max_num_seqs=seqs)
        if _estimate_gpu_kv_memory(device, fewer, geometry, memory, model_bytes, backend) >= 2 * bytes_per_block:
            return PredictedRefusal(NO_KV_CACHE_MEMORY, message + "; the memory profile's peak grows with "
                                    "max_num_seqs", FlagChange({"--max-num-seqs": seqs}), certain=not estimated)
    return PredictedRefusal(NO_KV_CACHE_MEMORY, message + "; no flag frees enough: more GPUs "
                    "(--tensor-parallel-size), a quantized checkpoint or a smaller model", NO_CHANGE,
                    certain=not estimated)
