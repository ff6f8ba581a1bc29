"""vLLM's GPU memory budget before launch, release by release (pure).

vLLM gives the KV cache what its memory profile leaves (v1/worker/gpu_worker.py
determine_available_memory; worker/worker.py determine_num_available_blocks in the V0 engine):

    KV = CUDA total x gpu_memory_utilization - weights - activation peak - non-torch [- runner state] [- CUDA graphs]

- **CUDA total**: what the CUDA runtime reports (torch.cuda.mem_get_info), a little below NVML's
  total (devices.cuda_total_bytes).
- **Weights**: the checkpoint's tensors (planner/weights.py) and what the model allocates beside them
  before the loader reports "Model loading took": the rotary cos/sin cache, Qwen3-VL's deepstack
  buffers (vllm_releases/rope_cache.py).
- **Activation peak**: the profile run is one forward pass of `max_num_batched_tokens` tokens, then
  one sampler pass over `min(max_num_seqs, max_num_batched_tokens)` requests with top-k and top-p
  set. The sampler's float32 buffers over requests x vocabulary dominate whenever the vocabulary is
  large: a sort-based top-k/top-p keeps ~9.7 logits-sized float32 copies live (the fp32 logits,
  sorted values, int64 indices, masks, softmax, cumulative sum, the sampling noise); FlashInfer's
  keeps ~3, vLLM's Triton kernel ~3.8. The forward pass holds the hidden states and one layer's MLP;
  a multimodal model's dummy encoder outputs stay cached through both (planner/encoder_cache.py), and
  so does the workspace buffer: the fused-MoE workspaces, or from 0.33 TRITON_MLA's decode logits where
  larger (vllm_releases/mla_workspace.py).
  A pooling run (embedding, reranking, classification) has no sampler pass: its pooler's peak instead,
  and no LM head where vLLM converts a generative model (planner/pooling_run.py).
  V0's profile of Llama 3.2 Vision first runs the vision encoder over one dummy image per dummy
  sequence, which peaks above both (vllm_releases/mllama_profile.py).
- **Non-torch**: cuBLAS/NCCL workspaces allocated during the profile; more with tensor parallelism
  (NCCL's buffers: about 2 GiB per rank where the ranks are NVLink peers, planner/non_torch.py).
- **Runner state** (from 0.27): the budget takes the free memory consumed since the worker's
  snapshot, so torch memory the runner allocates outside the loader's figure counts too: the V2
  runner's penalty statistics (vllm_releases/model_runner_v2.py).
- **CUDA graphs**: captured after the KV cache is sized, so not taken from it, until the graph
  estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: opt-in from 0.18, on by default from 0.20,
  whatever 0.20's log says) became part of the budget; the V2 runner makes no estimate before 0.29,
  so a model it runs (0.22 on, by the release's own rules) takes none (vllm_releases/model_runner_v2.py).

The sampler lines say which sampler the profile runs; the default utilization, whether graphs count
and the scheduler defaults are the release's own (vllm_releases/defaults.py, read from its source). The per-element sampler bytes, the non-torch and graph figures
are measured from public start-up logs of real GPUs (tests/fixtures/gpu_logs); everything else is
read from vLLM's code. A launch replaces the estimate with the engine's own figures (learned).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from kvwatch.planner.devices import Device, GiB, cuda_total_bytes, multiprocessors, scheduler_memory_bytes
from kvwatch.planner.encoder_cache import EncoderShape, counted_and_encoded_tokens, encoder_cache_bytes, profile_items
from kvwatch.planner.encoder_forward import encoder_forward_bytes
from kvwatch.planner.encoder_held import profile_inputs_held_bytes, profiled_shape
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.extensible_kv import (
    Extensible,
    extensible_for,
    extensible_kv_bytes,
    unset_utilization,
)
from kvwatch.planner.free_memory import others_non_torch_bytes, snapshot_free_bytes
from kvwatch.planner.non_torch import non_torch_bytes
from kvwatch.planner.pooling_run import DEFAULT_NUM_LABELS, pooler_peak_bytes, run_of
from kvwatch.planner.weights import WeightCount
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE, resolve
from kvwatch.vllm_releases.cudagraph_sizes import capture_sizes, default_sizes
from kvwatch.vllm_releases.defaults_shape import CUDAGRAPH_ABSENT, ExtensibleSizing, ReleaseDefaults
from kvwatch.vllm_releases.mla_workspace import decode_logits_bytes, reserved_in_profile
from kvwatch.vllm_releases.mllama_profile import (
    MLLAMA_ARCHITECTURE,
    V0_ONLY_SINCE,
    cross_states_bytes,
    runs_v0_profile,
    vision_peak_bytes,
)
from kvwatch.vllm_releases.model_runner_v2 import (
    TOTAL_CONSUMED_SINCE,
    graph_estimate_taken,
    penalty_state_bytes,
    runs_v2_runner,
)
from kvwatch.vllm_releases.release_defaults import api_batch_defaults, defaults_for

# Sampler peak per (request x vocabulary) element. Sort-based top-k/top-p: 4.76, 5.56, 5.64 and
# 7.38 GiB on four H100 logs (1,024 requests; vocabularies 128,256-201,088) and 0.94-1.42 GiB on
# three V0 logs (256 requests): 38.7 B. FlashInfer/Triton: 0.5-0.6 GiB at 256 requests on A100
# 0.10 logs, less the non-torch memory: 12 B.
SORTED_SAMPLER_BYTES = 38.7
FUSED_SAMPLER_BYTES = 12.0
# vLLM's Triton top-k/top-p kernel (0.17 on): 14.9-16.1 B on the twenty 0.19.0 H100 fit runs of the llm-d
# sweep with 1,024 requests (vocabularies 128,256-256,000; "torch peak memory increase" over requests x vocab).
TRITON_SAMPLER_BYTES = 15.3
CUDA_GRAPH_BYTES = int(0.5 * GiB)             # a graph pool as logged: 0.27-0.65 GiB on one GPU
# From 0.14 unquantized MoE layers run vLLM's modular fused-MoE kernel (vLLM 0.14.1,
# model_executor/layers/fused_moe/unquantized_fused_moe_method.py: self.kernel), whose two workspaces
# come from one global workspace manager that keeps them allocated (vLLM 0.19.1,
# model_executor/layers/fused_moe/modular_kernel.py:1063 get_simultaneous; v1/worker/workspace.py): they
# stay live through the profile's sampler pass. Triton experts' shapes (fused_moe.py:1976-1991):
# (M, top-k, max(N/2, K)) and (M, top-k, max(N, K)), N = 2 x the rank's expert width, K = hidden,
# M = the pass's tokens (one chunk: modular_kernel.py:1189-1193 passes M_full for M_chunk).
MOE_WORKSPACE_SINCE = (0, 14, 0)
V0_ENGINE, V1_ENGINE = "v0", "v1"
# The wheels of vLLM 0.8.5.post1 and 0.9.2 do not name flashinfer-python, those of 0.10.2 and 0.11.0 only
# as an extra (`extra == "flashinfer"`), that of 0.11.2 requires it (their METADATA, Requires-Dist);
# 0.11.1 starts the sampler line where the default no longer uses it (#26859).
FLASHINFER_IN_WHEEL_SINCE = (0, 11, 1)
CUDAGRAPH_ENV = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"


@dataclass(frozen=True)
class SamplerLine:
    """The sampler a line of vLLM releases runs in its memory profile (a memory term, measured)."""

    since: tuple[int, int, int]
    engine: str                    # "v0" or "v1" (the default engine of the line)
    sampler_bytes: float           # the profile's sampler peak per request x vocab element
    why: str


# Oldest first, PR numbers in `why`: 0.8 (V1 by default), 0.11.1 (#26859); the Triton kernel from 0.17
# (vLLM 0.17.1, vllm/v1/sample/ops/topk_topp_triton.py, absent from 0.16.0).
SAMPLER_LINES = (
    SamplerLine((0, 0, 0), V0_ENGINE, SORTED_SAMPLER_BYTES,
                "V0 engine: the profile samples 256 dummy sequences with top-k/top-p by sorting"),
    SamplerLine((0, 8, 0), V1_ENGINE, FUSED_SAMPLER_BYTES,
                "V1 engine by default; FlashInfer top-k/top-p sampling where installed (#11394)"),
    SamplerLine((0, 11, 1), V1_ENGINE, SORTED_SAMPLER_BYTES,
                "FlashInfer sampling off by default (#26859): the profile sorts the logits"),
    SamplerLine((0, 17, 0), V1_ENGINE, TRITON_SAMPLER_BYTES,
                "vLLM's Triton top-k/top-p kernel replaces the sort (#33538)"),
)
# V0's scheduler defaults, every card: vLLM 0.8.5, vllm/engine/arg_utils.py:1563 (256 sequences) and
# vllm/config.py:68 (_DEFAULT_MAX_NUM_BATCHED_TOKENS).
V0_MAX_NUM_SEQS = 256
V0_MIN_BATCHED_TOKENS = 2048


@dataclass(frozen=True)
class Release:
    """What a vLLM release does when it profiles memory: its sampler line, and the defaults and
    switches read from its source (vllm_releases/defaults.py), as the engine's environment sets them."""

    engine: str
    sampler_bytes: float
    defaults: ReleaseDefaults
    cuda_graphs_counted: bool      # the CUDA graph estimate is taken from the KV budget
    why: str
    sampler_since: tuple[int, int, int] = (0, 0, 0)   # the first release of its sampler line

    @property
    def default_utilization(self) -> float:
        return self.defaults.gpu_memory_utilization


def release_for(version: VllmVersion | None, env: Mapping[str, str] | None = None,
                architectures: tuple[str, ...] = ()) -> Release:
    version = version or DEFAULT_RELEASE
    env = env or {}
    line = [r for r in SAMPLER_LINES if r.since <= version.parts][-1]
    why = line.why
    defaults = defaults_for(version)
    if line.engine == V1_ENGINE and defaults.v0_switch_source and env.get("VLLM_USE_V1", "").strip() == "0":
        line, why = SAMPLER_LINES[0], SAMPLER_LINES[0].why   # the V0 engine, asked for (until 0.11 removed it)
    elif line.engine == V1_ENGINE and v0_only(version, architectures) and env.get("VLLM_USE_V1", "").strip() != "1":
        line = SAMPLER_LINES[0]
        why = f"{line.why}; {MLLAMA_ARCHITECTURE} is V0-only: the engine falls back to V0 (vllm_releases/mllama_profile.py)"
    sampler = line.sampler_bytes
    flashinfer = env.get("VLLM_USE_FLASHINFER_SAMPLER", "").strip()
    if line.engine == V1_ENGINE and flashinfer in ("0", "1") and line.since < (0, 17, 0):
        # before vLLM's Triton kernel the flag chose between FlashInfer and the sort
        sampler = FUSED_SAMPLER_BYTES if flashinfer == "1" else SORTED_SAMPLER_BYTES
        why += f"; VLLM_USE_FLASHINFER_SAMPLER={flashinfer}"
    if (choice := resolve(version)).why:
        why += f"; {choice.why}"
    graphs_env = env.get(CUDAGRAPH_ENV)
    graphs = defaults.cudagraphs_counted(graphs_env)
    if graphs:
        why += (f"; CUDA graph memory estimated and taken from the KV budget "
                f"({defaults.cite(defaults.cudagraph_applied_source)})")
    if graphs_env is not None and defaults.cudagraph_estimate != CUDAGRAPH_ABSENT:
        why += f"; {CUDAGRAPH_ENV}={graphs_env.strip()}"
    return Release(line.engine, sampler, defaults, graphs, why, line.since)


def v0_only(version: VllmVersion, architectures: tuple[str, ...]) -> bool:
    """The model runs on V0 whatever the release's default engine (Mllama, vllm_releases/mllama_profile.py)."""
    return MLLAMA_ARCHITECTURE in architectures and V0_ONLY_SINCE <= version.parts and runs_v0_profile(version.parts)


def utilization(settings: EngineSettings, release: Release, extensible: Extensible | None = None) -> float:
    """The fraction vLLM sizes against: the flag, else the release's default (1.0 where the
    extensible KV cache is on, 0.34+)."""
    if settings.gpu_memory_utilization_given:
        return settings.gpu_memory_utilization
    return release.default_utilization if extensible is None else unset_utilization(extensible, release.default_utilization)


def api_defaults(device: Device, settings: EngineSettings, release: Release) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of the release's get_batch_defaults for the API server
    (vllm_releases/defaults.py), before any flag: the card's total as NVML reports it, which is what
    the CUDA platform's get_device_total_memory returns (vLLM 0.32.0, vllm/platforms/cuda.py:801)."""
    world = settings.tensor_parallel_size * settings.pipeline_parallel_size
    total = scheduler_memory_bytes(device) if device.platform != "cpu" else 0
    return api_batch_defaults(release.defaults, device.platform, total, device.name, device.compute_capability, world)


def batch_defaults(settings: EngineSettings, device: Device, release: Release, max_model_len: int,
                   v0_chunked_prefill_supported: bool = True) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) the scheduler takes for the API server: the release's
    defaults (api_defaults), the V0 engine's own, the flags over them. `v0_chunked_prefill_supported`:
    False for a multimodal or MLA model, which V0 never chunks by default."""
    tokens, seqs = api_defaults(device, settings, release)
    if release.engine == V0_ENGINE:
        # V0 turned chunked prefill on by default only for contexts above 32K, and never for multimodal
        # or MLA models (vLLM 0.8.5.post1, vllm/engine/arg_utils.py:1505-1513)
        chunked = settings.enable_chunked_prefill if settings.enable_chunked_prefill is not None \
            else max_model_len > 32768 and v0_chunked_prefill_supported
        tokens = V0_MIN_BATCHED_TOKENS if chunked else max(max_model_len, V0_MIN_BATCHED_TOKENS)
        seqs = V0_MAX_NUM_SEQS
    elif settings.enable_chunked_prefill is False:
        tokens = max(max_model_len, tokens)
    tokens = settings.max_num_batched_tokens or tokens
    seqs = settings.max_num_seqs or seqs
    return tokens, seqs


@dataclass(frozen=True)
class GpuBudget:
    """One GPU's memory as vLLM will split it (per rank), before launch."""

    version: str
    release: str
    cuda_total_bytes: int
    utilization: float
    weights_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int          # counted only where the release takes the graph estimate (0 otherwise)
    max_num_batched_tokens: int
    max_num_seqs: int
    # torch memory allocated after the worker's snapshot outside the loader's figure, which the budget
    # charges from 0.27 (vllm_releases/model_runner_v2.py): the V2 runner's sampler state
    runner_state_bytes: int = 0
    # 0.34+: the extensible KV cache sizes the cache after warm-up (planner/extensible_kv.py); None: the
    # profile's estimate sizes it (every release before 0.34, and 0.34 with it off)
    extensible: ExtensibleSizing | None = None
    free_at_start_bytes: int = 0   # the card's free memory at the worker's first snapshot (extensible only)
    stated_free_bytes: int | None = None   # --gpu-free-memory: free before the start (planner/free_memory.py)

    @property
    def requested_bytes(self) -> int:
        return int(self.cuda_total_bytes * self.utilization)

    @property
    def non_kv_bytes(self) -> int:
        return (self.weights_bytes + self.activation_peak_bytes + self.non_torch_bytes + self.cuda_graph_bytes
                + self.runner_state_bytes)

    @property
    def resident_bytes(self) -> int:
        """What the engine keeps after warm-up, the KV cache apart (the captured graphs included)."""
        return self.weights_bytes + self.non_torch_bytes + self.cuda_graph_bytes + self.runner_state_bytes

    @property
    def transient_bytes(self) -> int:
        """The peak the extensible cache keeps free: the activation peak and the graph estimate."""
        return self.activation_peak_bytes + self.cuda_graph_bytes

    @property
    def kv_cache_bytes(self) -> int:
        if self.extensible is not None:
            return extensible_kv_bytes(self.extensible, self.requested_bytes, self.free_at_start_bytes,
                                       self.resident_bytes, self.transient_bytes)
        return max(0, self.requested_bytes - self.non_kv_bytes)

    def to_json(self) -> dict[str, object]:
        out = {**asdict(self), "requested_bytes": self.requested_bytes, "parts": self.parts()}
        if self.extensible is None:   # the releases before 0.34 keep their JSON as it was
            del out["extensible"], out["free_at_start_bytes"]
        if self.stated_free_bytes is None:   # plans without a stated free memory keep their JSON as it was
            del out["stated_free_bytes"]
        return out

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights_bytes, "activation_peak": self.activation_peak_bytes,
                "non_torch": self.non_torch_bytes, "cuda_graphs": self.cuda_graph_bytes,
                "runner_state": self.runner_state_bytes, "kv_cache": self.kv_cache_bytes}


def activation_peak_bytes(count: WeightCount | None, tokens: int, seqs: int, dtype_bytes: int,
                          tensor_parallel: int, sampler_bytes: float, held_bytes: int = 0,
                          vision: tuple[int, int] = (0, 0), pooler_bytes: int = 0) -> int:
    """The profile run's peak: the larger of the forward pass (hidden states plus one layer's MLP
    on this rank) and the sampler over min(seqs, tokens) requests x the whole vocabulary (V1 gathers
    the logits on every rank), plus what stays allocated through both: a multimodal model's cached
    dummy encoder outputs (planner/encoder_cache.py; every rank holds them whole) and the fused-MoE
    workspaces (moe_workspace_bytes) or TRITON_MLA's decode workspace, which share one buffer
    (mla_decode_workspace_bytes). `vision`: the vision encoder's own pass, which comes first, and
    the vision states held through the language model's pass (V0 Mllama: v0_vision_profile; V1 Qwen-VL
    towers: v1_encoder_pass_bytes, nothing held beyond the cache). A pooling run has no sampler pass
    (sampler_bytes 0) and runs its pooler over the hidden states instead (`pooler_bytes`, planner/pooling_run.py)."""
    if count is None:
        return 0
    forward = forward_pass_bytes(count, tokens, dtype_bytes, tensor_parallel)
    sampler = int(min(seqs, tokens) * count.vocab_size * sampler_bytes)
    encoder_peak, cross_states = vision
    # the encoder's pass comes first, before the cache and the MoE workspaces hold anything
    return max(max(forward + cross_states, sampler, pooler_bytes) + held_bytes, encoder_peak)


def forward_pass_bytes(count: WeightCount, tokens: int, dtype_bytes: int, tensor_parallel: int) -> int:
    """One forward pass's activations over `tokens` on a rank: the hidden states and one layer's MLP.
    A gated MLP holds its gate-up output (2 x width) and the activation's (width); a two-matrix MLP its
    up output and the activation's: as many widths as it has matrices."""
    mlp = count.mlp_matrices * count.mlp_width_per_token // max(1, tensor_parallel)
    return tokens * dtype_bytes * (4 * count.hidden_size + mlp)


def wide_graph_bytes(count: WeightCount | None, version: VllmVersion | None, device: Device, settings: EngineSettings,
                     tokens: int, seqs: int, dtype_bytes: int) -> int:
    """What 0.34's wider capture grids on the SM100 family add to the CUDA graph pool
    (vllm_releases/cudagraph_sizes.py); 0 wherever the default list stands, which CUDA_GRAPH_BYTES was
    measured with. The graphs share one pool whose baseline is the largest graph's working set (vLLM's
    own estimate takes the first, largest capture as the pool's baseline and adds a per-graph cost for
    the others: vLLM 0.34.0, vllm/v1/worker/gpu/cudagraph_utils.py:1098-1106), modelled as one forward
    pass's activations at its token count: the term is that working set at the widest graph less at
    the default list's widest. No SM100 log of 0.34 measures it yet."""
    if count is None or device.platform != "cuda":
        return 0
    sizes = capture_sizes((version or DEFAULT_RELEASE).parts, device.compute_capability, seqs, tokens,
                          settings.cudagraph_sizes_given)
    if not sizes.wide:
        return 0
    tp = settings.tensor_parallel_size
    default = max(default_sizes(seqs, tokens, sm100=True), default=0)
    return max(0, forward_pass_bytes(count, sizes.largest, dtype_bytes, tp) - forward_pass_bytes(count, default, dtype_bytes, tp))


def graphs_note(version: VllmVersion | None, device: Device, settings: EngineSettings, tokens: int, seqs: int,
                counted: bool) -> str:
    """The release text's note of 0.34's wider SM100 capture grids, where the budget counts the graphs."""
    if not counted or settings.enforce_eager or device.platform != "cuda":
        return ""
    sizes = capture_sizes((version or DEFAULT_RELEASE).parts, device.compute_capability, seqs, tokens,
                          settings.cudagraph_sizes_given)
    return f"; {len(sizes.tokens)} CUDA graph sizes up to {sizes.largest} tokens on SM100 ({sizes.source})" \
        if sizes.wide else ""


def v0_vision_profile(count: WeightCount | None, seqs: int, tensor_parallel: int, dtype_bytes: int,
                      version: VllmVersion | None) -> tuple[int, int]:
    """(vision encoder peak, vision states held through the language model) of the V0 profile of
    Llama 3.2 Vision, one dummy image per dummy sequence (vllm_releases/mllama_profile.py); (0, 0) for
    any other model or a release without Mllama."""
    parts = (version or DEFAULT_RELEASE).parts
    if count is None or count.mllama_vision is None or not runs_v0_profile(parts):
        return 0, 0
    return (vision_peak_bytes(count.mllama_vision, seqs, tensor_parallel, dtype_bytes, parts),
            cross_states_bytes(count.mllama_vision, seqs, dtype_bytes))


def expert_parallel(settings: EngineSettings) -> bool:
    """The MoE layers run expert parallel (vLLM 0.32.0, vllm/model_executor/layers/fused_moe/config.py:1189-1236
    FusedMoEParallelConfig.make: `use_ep` when dp x pcp x tp > 1 and --enable-expert-parallel)."""
    ranks = max(1, settings.tensor_parallel_size) * max(1, settings.data_parallel_size)
    return settings.enable_expert_parallel and ranks > 1


def expert_width_shards(settings: EngineSettings) -> int:
    """How many ways an expert's width is split: over the tensor-parallel ranks, or not at all with
    expert parallelism, where each rank owns whole experts (expert_parallel; then tp_size=1). Data
    parallelism is not told apart: its ranks flatten into the split and gather each other's tokens."""
    return 1 if expert_parallel(settings) else max(1, settings.tensor_parallel_size)


def v1_encoder_pass_bytes(shape: EncoderShape | None, version: tuple[int, int, int], tokens: int, seqs: int,
                          tensor_parallel: int, dtype_bytes: int) -> int:
    """The V1 profile's vision encoder pass over its dummy batch (planner/encoder_forward.py)."""
    if shape is None or tokens <= 0:
        return 0
    items, _, _ = profile_items(shape, version, tokens, seqs)
    encoded = counted_and_encoded_tokens(shape, version)[1]
    return encoder_forward_bytes(shape.tower, items, encoded, tensor_parallel, dtype_bytes)


def moe_workspace_bytes(count: WeightCount | None, tokens: int, dtype_bytes: int, expert_width_shards: int) -> int:
    """The fused-MoE workspaces one rank keeps (MOE_WORKSPACE_SINCE); 0 for a dense model."""
    if count is None or not count.experts_per_token or not count.moe_width:
        return 0
    width = -(-count.moe_width // max(1, expert_width_shards))   # the rank's share of each expert's width
    hidden = count.hidden_size
    return tokens * count.experts_per_token * (max(width, hidden) + max(2 * width, hidden)) * dtype_bytes


def mla_decode_workspace_bytes(backend: str | None, version: VllmVersion | None, device: Device, seqs: int,
                               tensor_parallel: int, max_model_len: int, heads_and_rank: tuple[int, int]) -> int:
    """The decode workspace TRITON_MLA claims in the release's profile run (vllm_releases/mla_workspace.py);
    0 for another backend, a release before 0.33 or a model that is not MLA."""
    heads, rank = heads_and_rank
    if device.platform != "cuda" or not rank or not reserved_in_profile(backend, (version or DEFAULT_RELEASE).parts):
        return 0
    return decode_logits_bytes(seqs, heads // max(1, tensor_parallel), rank, max_model_len, multiprocessors(device))


def profile_sampler_bytes(release: Release, flashinfer_installed: bool | None) -> float:
    """The sampler's peak per request x vocabulary element in the profile run. Before vLLM's Triton
    top-k/top-p kernel (0.17) the V1 sampler used FlashInfer only where the package is installed
    (v1/sample/ops/topk_topp_sampler.py: `if is_flashinfer_available: ... else: forward_native`):
    without it the profile sorts the logits whatever the release line defaults to. Unknown (None):
    what `pip install vllm` gives, FlashInfer only from the wheels that require it (FLASHINFER_IN_WHEEL_SINCE)."""
    installed = flashinfer_installed
    if installed is None:
        installed = release.sampler_since >= FLASHINFER_IN_WHEEL_SINCE
    if not installed and release.engine == V1_ENGINE and release.sampler_since < (0, 17, 0):
        return SORTED_SAMPLER_BYTES
    return release.sampler_bytes


def weights_on_gpu(weights_per_rank: int, settings: EngineSettings, count: WeightCount | None,
                   dtype_bytes: int) -> int:
    """The weights a rank keeps on its GPU under `--cpu-offload-gb` (GiB per GPU, config/offload.py).
    vLLM offloads only the decoder layers `make_layers` builds, parameter by parameter in module order,
    and stops at the first parameter that finds the budget reached, so it moves whole parameters up to
    one past the budget (vLLM 0.7.2, vllm/model_executor/models/utils.py:487-518 and :558; vLLM 0.32.0,
    vllm/model_executor/offloader/uva.py:74-124, models/utils.py:913). The embeddings, the LM head and a
    vision tower stay on the card whatever the budget."""
    budget = int(settings.cpu_offload_gb * GiB)
    if budget <= 0:
        return weights_per_rank
    ranks = max(1, settings.tensor_parallel_size * settings.pipeline_parallel_size)
    layers = decoder_layer_bytes(weights_per_rank * ranks, count, dtype_bytes) // ranks
    return weights_per_rank - offloaded_bytes(layers, budget, count)


def decoder_layer_bytes(weights: int, count: WeightCount | None, dtype_bytes: int) -> int:
    """The part of `weights` (all ranks) in the decoder layers, the only part --cpu-offload-gb moves:
    the embeddings, the LM head and a vision tower (in the model dtype) stay on the card."""
    kept = (count.embedding_params + count.vision_params) * dtype_bytes if count is not None else 0
    return max(0, weights - kept)


def offloaded_bytes(layers_bytes: int, budget: int, count: WeightCount | None) -> int:
    """What the offloader moves off a rank holding `layers_bytes` of decoder layers: whole parameters
    until `budget` is reached (a layer's parameters in count.layer_params' proportions; where the count
    has no such split, MoE and MLA layers, the budget exactly)."""
    if budget >= layers_bytes:
        return layers_bytes
    if count is None or not count.layer_params or count.num_layers <= 0:
        return budget
    per_layer = layers_bytes / count.num_layers
    moved = (budget // per_layer) * per_layer
    for params in count.layer_params:
        if moved >= budget:
            break
        moved += per_layer * params / sum(count.layer_params)
    return min(layers_bytes, int(moved))


def replicated_extra_bytes(count: WeightCount | None, tensor_parallel: int, pipeline_parallel: int,
                           dtype_bytes: int, replicated_linear_bytes: int = 0) -> int:
    """What a rank holds beyond its even share of the weights: every rank of a tensor-parallel group
    keeps its stage's MoE routers (WeightCount.router_params, model dtype) and MLA's replicated
    projections (`replicated_linear_bytes`, all layers as loaded) whole."""
    whole = (count.router_params * dtype_bytes if count is not None else 0) + replicated_linear_bytes
    if whole <= 0 or tensor_parallel <= 1:
        return 0
    stage = whole // max(1, pipeline_parallel)
    return stage - stage // tensor_parallel


def loaded_buffer_bytes(count: WeightCount | None, tokens: int, dtype_bytes: int) -> int:
    """What a rank allocates with the model beyond the checkpoint's tensors, before the loader reports
    the weights (vllm_releases/rope_cache.py): the rotary cos/sin cache, whole on every rank, and
    Qwen3-VL's deepstack buffers of `tokens` (max_num_batched_tokens) rows each, in the model dtype."""
    if count is None:
        return 0
    return (count.rope_cache_elements + count.deepstack_levels * tokens * count.hidden_size) * dtype_bytes


def runner_state_bytes(count: WeightCount | None, seqs: int, version: VllmVersion | None, platform: str,
                       v2_runner: bool) -> int:
    """What the model runner keeps allocated after the worker's memory snapshot beyond the loader's
    figure, where the release's budget charges it (from 0.27, model_runner_v2.TOTAL_CONSUMED_SOURCE):
    the V2 runner's penalty statistics, max_num_seqs x vocabulary (model_runner_v2.PENALTY_STATE_SOURCE).
    0.26 and earlier measured the profile's torch peak from its own start, so it did not count them."""
    parts = (version or DEFAULT_RELEASE).parts
    if count is None or not count.vocab_size or platform != "cuda" or parts < TOTAL_CONSUMED_SINCE or not v2_runner:
        return 0
    return penalty_state_bytes(seqs, count.vocab_size)


def estimate_budget(settings: EngineSettings, device: Device, count: WeightCount | None, weights_per_rank: int,
                    dtype_bytes: int, max_model_len: int, version: VllmVersion | None,
                    env: Mapping[str, str] | None = None, flashinfer_installed: bool | None = None,
                    experts_without_workspace: bool = False, mla: bool = False, replicated_linear_bytes: int = 0,
                    architectures: tuple[str, ...] = (), hybrid: bool = False, backend: str | None = None,
                    mla_heads_and_rank: tuple[int, int] = (0, 0), sentence_transformers: bool = False,
                    quantized: bool = False) -> GpuBudget:
    """The budget of one rank. `backend`: the attention backend the plan picks; `mla_heads_and_rank`:
    an MLA model's query heads and kv_lora_rank (what TRITON_MLA's decode workspace is sized by);
    `sentence_transformers`: the checkpoint names a Sentence Transformers Pooling module; `quantized`:
    the checkpoint or the flags quantize the weights (0.22-0.23 keep those off the V2 runner)."""
    release = release_for(version, env, architectures)
    parts = (version or DEFAULT_RELEASE).parts
    v2 = device.platform == "cuda" and release.engine == V1_ENGINE and runs_v2_runner(
        parts, architectures, bool(count and count.experts_per_token), hybrid, (env or {}).get("VLLM_USE_V2_MODEL_RUNNER"),
        quantized)
    multimodal = count is not None and (count.vision_params > 0 or count.encoder is not None)
    tokens, seqs = batch_defaults(settings, device, release, max_model_len, not (multimodal or mla))
    tp = max(1, settings.tensor_parallel_size)
    pooling = run_of(settings, architectures, version, sentence_transformers)
    # a pooling run profiles its pooler, not the sampler (planner/pooling_run.py)
    sampler = 0.0 if pooling.pooling else profile_sampler_bytes(release, flashinfer_installed)
    # V0 at tensor parallel: rank 0 gathers the logits and samples (vLLM 0.8.5.post1,
    # vllm/model_executor/layers/logits_processor.py:97-98, worker/model_runner.py:1810-1813), and the
    # executor keeps the fewest blocks any rank found (executor/executor_base.py:103-105): rank 0's, sampler included.
    extra = 0   # live through the sampler's pass: the encoder cache, the workspace (MoE, MLA decode)
    workspace = 0
    vision = (0, 0)
    if release.engine == V0_ENGINE:
        vision = v0_vision_profile(count, seqs, tp, dtype_bytes, version)
    if release.engine == V1_ENGINE and count is not None and version is not None:
        shape = profiled_shape(count.encoder, dict(settings.mm_limits), settings.skip_mm_profiling)   # the user's flags
        extra = encoder_cache_bytes(shape, version.parts, tokens, seqs, dtype_bytes) + profile_inputs_held_bytes(
            shape, version.parts, tokens, seqs, dtype_bytes, v2)
        vision = (v1_encoder_pass_bytes(shape, version.parts, tokens, seqs, tp, dtype_bytes), 0)
        if version.parts >= MOE_WORKSPACE_SINCE and not experts_without_workspace:
            workspace = moe_workspace_bytes(count, tokens, dtype_bytes, expert_width_shards(settings))
    # one workspace buffer, grown to the largest request: TRITON_MLA's decode logits share the MoE's
    extra += max(workspace, mla_decode_workspace_bytes(backend, version, device, seqs, tp, max_model_len,
                                                       mla_heads_and_rank))
    extensible = extensible_for(settings, device.platform, release.defaults)
    total = cuda_total_bytes(device)
    return GpuBudget(
        version=str(version or DEFAULT_RELEASE), release=release.why + (
            f"; extensible KV cache {extensible.why}" if release.defaults.extensible is not None else "")
        + graphs_note(version, device, settings, tokens, seqs, release.cuda_graphs_counted),
        cuda_total_bytes=total,
        utilization=utilization(settings, release, extensible),
        weights_bytes=weights_on_gpu(weights_per_rank, settings, count, dtype_bytes) + loaded_buffer_bytes(count, tokens, dtype_bytes)
        + replicated_extra_bytes(count, tp, settings.pipeline_parallel_size, dtype_bytes, replicated_linear_bytes),
        activation_peak_bytes=activation_peak_bytes(count, tokens, seqs, dtype_bytes, tp, sampler, extra, vision,
                                                    pooler_peak_bytes(pooling, tokens, count.hidden_size, dtype_bytes,
                                                                      DEFAULT_NUM_LABELS) if count else 0),
        non_torch_bytes=non_torch_bytes(device, tp, version, not settings.compilation_off) + others_non_torch_bytes(device, release.engine, version),
        cuda_graph_bytes=CUDA_GRAPH_BYTES + wide_graph_bytes(count, version, device, settings, tokens, seqs, dtype_bytes)
        if release.cuda_graphs_counted and not settings.enforce_eager and graph_estimate_taken(parts, v2) else 0,
        max_num_batched_tokens=tokens, max_num_seqs=seqs,
        # the V2 runner builds no sampler, so no penalty state, for a pooling model (vLLM 0.27.1,
        # v1/worker/gpu/model_runner.py:351-352; 0.34.0 :486-513)
        runner_state_bytes=0 if pooling.pooling else runner_state_bytes(count, seqs, version, device.platform, v2),
        extensible=extensible.sizing, free_at_start_bytes=snapshot_free_bytes(device) if extensible.sizing else 0,
        stated_free_bytes=device.free_memory_bytes)


def requested_bytes(device: Device, settings: EngineSettings, version: VllmVersion | None,
                    env: Mapping[str, str] | None = None) -> int:
    """CUDA total x the utilization vLLM of that version takes: the budget the KV cache is cut from."""
    release = release_for(version, env)
    extensible = extensible_for(settings, device.platform, release.defaults)
    return int(cuda_total_bytes(device) * utilization(settings, release, extensible))


def profile_key(settings: EngineSettings, device: Device, version: VllmVersion | None) -> str:
    """What a learned non-KV figure holds for: the model, the flags that change vLLM's profile run,
    the card and the vLLM release. Another port or utilization keeps it; another batch size does not."""
    parts = (settings.model, settings.dtype, settings.tensor_parallel_size, settings.pipeline_parallel_size,
             settings.max_model_len, settings.max_num_seqs, settings.max_num_batched_tokens,
             settings.enable_chunked_prefill, settings.enforce_eager, device.name, device.total_memory_bytes,
             str(version or DEFAULT_RELEASE))
    # the encoder's profile flags, only where given: the keys learned without them stand
    encoder: tuple[object, ...] = (settings.skip_mm_profiling, settings.mm_limits) \
        if settings.skip_mm_profiling or settings.mm_limits else ()
    encoder += ("language_model_only",) if settings.language_model_only else ()
    # compilation off without --enforce-eager (-O 0, mode 0), only where so: the keys learned without it stand
    uncompiled = ("compilation_off",) if settings.compilation_off and not settings.enforce_eager else ()
    return hashlib.sha256(repr(parts + encoder + uncompiled).encode()).hexdigest()[:16]
