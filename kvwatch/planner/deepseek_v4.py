"""DeepSeek-V4's cache kinds and vLLM 0.34's packing of them into blocks (pure).

One DeepSeek-V4 decoder layer carries up to five caches, each its own spec (vLLM 0.34.0):

- a sliding-window latent cache on every layer, MTP layers included: SlidingWindowMLASpec, block 64,
  window `sliding_window` (DeepseekV4SWACache, vllm/v1/attention/backends/mla/sparse_swa.py:85-88,
  :120-147);
- on layers whose compress ratio is above 1, the compressed latent: an MLAAttentionSpec of block 256
  (the DSv4 sparse MLA backend's kernel block, vllm/models/deepseek_v4/sparse_mla.py:60) holding
  one row per `ratio` tokens (tokens_per_state, vllm/models/deepseek_v4/attention.py:817-840);
- on those layers, a float32 compressor state: SlidingWindowMLASpec of `2 * coff * head_dim`
  floats a row, block 4 for ratio 4 and 8 for ratio 128, window `coff * ratio`, coff 2 for ratio 4
  and 1 otherwise (CompressorStateCache, vllm/models/deepseek_v4/compressor.py:139-192, :298);
- on ratio-4 layers only, the indexer's key cache: an MLAAttentionSpec of block 256, one
  `index_head_dim + index_head_dim // 128 * 4`-byte uint8 key per 4 tokens
  (vllm/models/deepseek_v4/attention.py:868-881, :983-986), and the indexer's own compressor state
  (as above, of `index_head_dim`).

The layer's ratio is `compress_rates[layer_types[i]]` (at least 1) for decoder layers and 1 for MTP
and DSpark layers (attention.py:238-243); a config.json that has only `compress_ratios` lists it per layer, as
transformers' DeepseekV4Config turns it into layer_types. Both `--kv-cache-dtype auto` and `fp8`
become the fp8_ds_mla layout on the attention classes CUDA picks by default on SM 9.0/10.0
(FlashMLA) and SM 12.0 (FlashInfer SM120), both with use_fp8_ds_mla_layout
(attention.py:95-130, nvidia/model.py:567-570, nvidia/flashinfer_sparse.py:622): a latent row is
584 bytes (448 NoPE + 128 RoPE + 8 scale) and every page is padded to 576 bytes
(_apply_alignment_padding, vllm/v1/kv_cache_interface.py:731-737).

vLLM groups them with _get_packed_kv_cache_groups (vllm/v1/core/kv_cache_planning.py:958-1085):
layers bucket by uniform type (here: spec kind, block size and window); a bucket whose page sizes
each hold the same number of layers is "balanced", and the balanced buckets are split into groups
of `repeats` layers per page size, `repeats` the value in [floor, max] that pads the balanced
buckets' layer counts least (ties to the larger; _approximate_gcd, :923-955), the floor being the
largest layer count of a balanced bucket that mixes page sizes. Every group shares one block pool,
so a block is as large as the largest group's pages and a KV budget holds
`budget // largest group page` blocks (_get_kv_cache_bytes_per_block, :620-648, and
get_kv_cache_config_from_groups, :724).

The DSpark draft (`--speculative-config` method "dspark"): DeepSeek-V4's reuses the target's
config.json and checkpoint, as DSparkDraftModel (v1/worker/gpu/spec_decode/dspark/config.py:56-68; 0.33.0 config/speculative.py:1555-1565),
whose `n_mtp_layers` (3 when unset or 0) DeepseekV4DecoderLayer at `layers.{num_hidden_layers + i}`
(models/deepseek_v4/nvidia/dspark.py:106, :132-141) are sliding-only (ratio 1) layers whose caches join
the target's; the draft block reads them non-causally in the attention metadata, not in the spec
(sparse_swa.py:566-580), and a DSpark speculator looks one prefill token ahead, as any drafter of the
target's hidden states, so the windows retain no more (dflash/config.py:19, speculator_config.py:122-125).
0.33.0 builds the same (its dspark.py:106, :132-141).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.values.versions import VllmVersion

# DeepSeek-V4.1 (DeepseekV41ForCausalLM, model_type deepseek_v41) is not one: planner/deepseek_v41.py plans it.
ARCHITECTURES = frozenset({"DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration", "DeepSeekV4MTPModel"})
MODEL_TYPES = frozenset({"deepseek_v4"})
# The releases whose code the oracle ran (tests/deepseek_v4_oracle.py): the same specs, groups and
# blocks (0.33.0: _get_packed_kv_cache_groups at vllm/v1/core/kv_cache_planning.py:914, _approximate_gcd :879).
CHECKED_MINORS = frozenset({(0, 33), (0, 34)})
SOURCE = "vLLM 0.34.0, vllm/models/deepseek_v4/attention.py:817-881, compressor.py:139-192, " \
         "vllm/v1/core/kv_cache_planning.py:958-1085"

MAIN_BLOCK = 256          # sparse_mla.py:60 and indexer.py:306: the latent and indexer kernel block
SWA_BLOCK = 64            # sparse_swa.py:85
ROW_BYTES = 584           # fp8_ds_mla latent row: 448 NoPE + 128 RoPE + 8 scale (attention.py:837-839)
PAGE_ALIGNMENT = 576      # fp8_ds_mla page alignment (attention.py:834, sparse_swa.py:87)
STATE_BLOCK = {4: 4, 128: 8}   # compressor.py:168-171
QUANT_BLOCK = 128         # the indexer's fp8 key scale block (attention.py:964)
_LAYER_RATIO = {"sliding_attention": 1}
STATE_KINDS = ("ring", "mamba", "replicated_mamba")   # the buckets split to fit the block (below)


@dataclass(frozen=True)
class CacheSpec:
    """One layer's cache as vLLM specifies it: the bucket it joins and its page."""

    name: str            # the layer name's tail: swa_cache, latent, indexer, state, indexer.state
    # "mla" (full attention), "swa_mla" (sliding window), "ring" (DeepSeek-V4.1's), "mamba" (GLM-5-Next's KDA),
    # "replicated_mamba" (a state every TP rank holds whole: Qwen4-Exp's PLE, its own bucket)
    kind: str
    block_size: int      # tokens per block
    window: int          # the sliding window (0 for full attention)
    page_bytes: int      # bytes of one block of this layer, padded
    dtype: str

    @property
    def bucket(self) -> tuple[str, int, int]:
        return self.kind, self.block_size, self.window


@dataclass(frozen=True)
class Group:
    """One KV cache group: its bucket and its layers' pages."""

    kind: str
    block_size: int
    window: int
    pages: tuple[int, ...]
    speculative_blocks: int = 0   # a Mamba group's state blocks for the speculative tokens (GLM-5-Next's KDA)

    @property
    def page_bytes(self) -> int:
        return sum(self.pages)

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int, extra_retained: int = 0) -> int:
        """Blocks one request of max_model_len holds in this group: a full-attention spec's
        cdiv(len, block) (FullAttentionSpec.max_memory_usage_bytes, vllm/v1/kv_cache_interface.py:654-659),
        a sliding one's window - 1 + retained + in-flight tokens, at most len, plus one
        (SlidingWindowSpec.max_admission_blocks_per_request, :932-958)."""
        if self.kind in ("mla", "full"):
            return -(-max_model_len // self.block_size)
        if self.kind == "ring":   # CircularBufferSpec: one block (vllm/v1/kv_cache_interface.py:996-1003)
            return 1
        if self.kind in STATE_KINDS[1:]:   # align mode, one prefill checkpoint, the speculative tokens' (:1168-1172; planner/glm5_next.py)
            return 3 + self.speculative_blocks
        held = min(self.window - 1 + extra_retained + max_in_flight_tokens, max_model_len)
        return -(-held // self.block_size) + 1


def _pad(size: int) -> int:
    return -(-size // PAGE_ALIGNMENT) * PAGE_ALIGNMENT


@dataclass(frozen=True)
class DeepseekV4Shape:
    """What vLLM's DeepSeek-V4 layers read from config.json to build their caches."""

    ratios: tuple[int, ...]   # each decoder layer's compress ratio (1: sliding window only)
    head_dim: int
    index_head_dim: int
    window: int
    mtp_layers: int           # num_nextn_predict_layers: the MTP draft's layers, when it runs
    dspark_layers: int = 3    # n_mtp_layers (3 when unset or 0): the DSpark draft's layers, when it runs

    def layer_ratios(self, mtp: bool, dspark: bool = False) -> list[int]:
        """Per cache layer: the decoder layers', then the MTP (or DSpark) layers' (ratio 1) when they draft."""
        drafts = self.mtp_layers if mtp else self.dspark_layers if dspark else 0
        return [*self.ratios, *[1] * drafts]


def is_deepseek_v4(model_type: str | None, architectures: Sequence[str]) -> bool:
    if NOT_PLANNED.keys() & set(architectures):
        return False
    return bool(ARCHITECTURES & set(architectures)) or (isinstance(model_type, str) and model_type in MODEL_TYPES)


def unchecked_release(version: VllmVersion | None) -> str:
    """Why a plan for this release is unsure ("" for a release the oracle checked)."""
    if version is None or version.parts[:2] in CHECKED_MINORS:
        return ""
    return (f"DeepSeek-V4's caches and their packing are checked against vLLM 0.33 and 0.34 only, "
            f"not vLLM {version}")


def _count(value: object, field: str, default: int | None = None) -> int:
    """A non-negative whole number of config.json (`default` where the field is unset)."""
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"config.json: DeepSeek-V4 field {field!r} must be a whole number, got {str(value)[:40]!r}")
    return value


def compress_ratios(cfg: Mapping[str, Any]) -> list[int]:
    """Each decoder layer's compress ratio (1: sliding window only)."""
    layers = _count(cfg.get("num_hidden_layers"), "num_hidden_layers")
    types, rates = cfg.get("layer_types"), cfg.get("compress_rates")
    if isinstance(types, list) and isinstance(rates, Mapping) and len(types) >= layers:
        return [max(1, _count(rates.get(t) if isinstance(t, str) else None, "compress_rates", 0))
                for t in types[:layers]]
    listed = cfg.get("compress_ratios")
    if isinstance(listed, list) and len(listed) >= layers:
        return [max(1, _count(r, "compress_ratios", 0)) for r in listed[:layers]]
    raise ConfigError("config.json: DeepSeek-V4 needs compress_ratios (or layer_types and compress_rates), "
                      "one a layer")


def deepseek_v4_shape(cfg: Mapping[str, Any], architectures: Sequence[str]) -> DeepseekV4Shape | None:
    """The shape of a DeepSeek-V4 (text) config.json; None for any other model."""
    if not is_deepseek_v4(cfg.get("model_type"), architectures):
        return None
    return DeepseekV4Shape(tuple(compress_ratios(cfg)), _count(cfg.get("head_dim"), "head_dim", 512),
                           _count(cfg.get("index_head_dim"), "index_head_dim", 128),
                           _count(cfg.get("sliding_window"), "sliding_window", 128),
                           _count(cfg.get("num_nextn_predict_layers"), "num_nextn_predict_layers", 0),
                           _count(cfg.get("n_mtp_layers"), "n_mtp_layers", 0) or 3)


def _state(name: str, ratio: int, head_dim: int) -> CacheSpec:
    coff = 1 + (ratio == 4)
    block = STATE_BLOCK[ratio]
    return CacheSpec(name, "swa_mla", block, coff * ratio, _pad(2 * coff * head_dim * 4 * block), "float32")


def layer_specs(shape: DeepseekV4Shape, mtp: bool = False, dspark: bool = False) -> list[list[CacheSpec]]:
    """Per layer (decoder layers, then the MTP or DSpark layers where they draft), its caches in vLLM's order."""
    head, window, index_head = shape.head_dim, shape.window, shape.index_head_dim
    out: list[list[CacheSpec]] = []
    for ratio in shape.layer_ratios(mtp, dspark):
        if ratio > 1 and ratio not in STATE_BLOCK:
            raise ConfigError(f"config.json: DeepSeek-V4 compress ratio {ratio}: vLLM takes 4 or 128 (compressor.py:158)")
        # the order the layer's constructor registers them (attention.py:304-373)
        layer: list[CacheSpec] = []
        if ratio == 4:
            key = index_head + index_head // QUANT_BLOCK * 4
            layer += [CacheSpec("indexer", "mla", MAIN_BLOCK, 0, _pad(MAIN_BLOCK // ratio * key), "uint8"),
                      _state("indexer.state", ratio, index_head)]
        layer.append(CacheSpec("swa_cache", "swa_mla", SWA_BLOCK, window, _pad(SWA_BLOCK * ROW_BYTES), "uint8"))
        if ratio > 1:
            layer += [CacheSpec("latent", "mla", MAIN_BLOCK, 0, _pad(MAIN_BLOCK // ratio * ROW_BYTES), "uint8"),
                      _state("state", ratio, head)]
        out.append(layer)
    return out


def _least_padding(values: Sequence[int], floor: int) -> int:
    """The chunk in [floor, max(values)] that rounds `values` up least; ties to the larger."""
    best, best_pad = max(1, floor), None
    for d in range(max(1, floor), max(values) + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def packed_groups(specs: Sequence[CacheSpec]) -> list[Group]:
    """The groups vLLM packs these layer caches into (kv_cache_planning.py:958-1085)."""
    buckets: dict[tuple[str, int, int], dict[int, list[int]]] = {}
    for spec in specs:
        buckets.setdefault(spec.bucket, {}).setdefault(spec.page_bytes, []).append(spec.page_bytes)
    if len({s.page_bytes for s in specs}) <= 1:
        return [Group(k, b, w, tuple(p for ps in pages.values() for p in ps)) for (k, b, w), pages in buckets.items()]

    def balanced(pages: dict[int, list[int]]) -> bool:
        return len({len(v) for v in pages.values()}) == 1

    widest = {key: max(len(v) for v in pages.values()) for key, pages in buckets.items()}
    floor = max((widest[k] for k, p in buckets.items() if balanced(p) and len(p) > 1), default=0)
    repeats = _least_padding([widest[k] for k, p in buckets.items() if balanced(p)], floor) if floor else None
    # state buckets: Mamba and rings always, unsplit sliding windows (kv_cache_planning.py:1037-1042)
    state = {k for k in buckets if k[0] in STATE_KINDS or (repeats is None and k[0] == "swa_mla")}

    def split(key: tuple[str, int, int], pages: dict[int, list[int]]) -> int:
        return -(-widest[key] // repeats) if repeats is not None and balanced(pages) else 1

    def widest_group(pages: dict[int, list[int]], n: int) -> int:
        return sum(-(-len(v) // n) * page for page, v in pages.items())

    anchor = max(widest_group(p, sum(map(len, p.values())) if k in state else split(k, p)) for k, p in buckets.items())
    groups: list[Group] = []
    for key, pages in buckets.items():
        n = split(key, pages)
        if key in state:
            per_block = max(anchor // next(iter(pages)), 1)
            n = max(n, -(-sum(map(len, pages.values())) // per_block))
        columns = list(zip(*pages.values(), strict=False)) if n > 1 else [tuple(p for v in pages.values() for p in v)]
        for i in range(n if n > 1 else 1):
            chunk = columns[i::n] if n > 1 else columns
            groups.append(Group(*key, tuple(p for repeat in chunk for p in repeat)))
    return groups


def bytes_per_block(groups: Sequence[Group]) -> int:
    """The shared block: the largest group's pages (every spec here has a block-stride alignment of 1)."""
    return max(g.page_bytes for g in groups)


def groups_for(shape: DeepseekV4Shape, mtp: bool = False, dspark: bool = False) -> list[Group]:
    """The KV cache groups of a DeepSeek-V4 model, with its MTP (or DSpark) layers where they draft."""
    return packed_groups([s for layer in layer_specs(shape, mtp, dspark) for s in layer])


def num_blocks(shape: DeepseekV4Shape, kv_memory_bytes: int, mtp: bool = False, dspark: bool = False) -> int:
    """Blocks vLLM 0.34 allocates for DeepSeek-V4 in `kv_memory_bytes` of one rank."""
    return kv_memory_bytes // bytes_per_block(groups_for(shape, mtp, dspark))


def capacity(groups: Sequence[Group], blocks: int, max_model_len: int, max_in_flight_tokens: int,
             extra_retained: int = 0) -> tuple[int, float]:
    """The tokens vLLM logs and its max concurrency: every group draws a request's blocks from the one
    pool, so concurrency is blocks over their sum, and the tokens are concurrency x max_model_len
    (get_max_concurrency_for_kv_cache_config and get_kv_cache_capacity, vllm/v1/core/kv_cache_utils.py:
    1082-1149). `extra_retained`: num_prefill_lookahead_tokens - 1, 0 but for multi-module MTP
    (vllm/v1/core/kv_cache_planning.py:1742)."""
    per_request = sum(g.blocks_per_request(max_model_len, max_in_flight_tokens, extra_retained) for g in groups)
    concurrency = blocks / per_request
    return int(concurrency * max_model_len), concurrency


def drafts_with_mtp(method: str | None, num_speculative_tokens: int) -> bool:
    """--speculative-config's method is MTP: "mtp", or a model-specific "*_mtp" name vLLM renames to it
    (vLLM 0.34.0, vllm/config/speculative.py:53-80 and :1375-1379). The DeepSeek-V4 MTP draft's
    layers (num_nextn_predict_layers, one in V4-Flash) then join the target's KV cache; more
    speculative tokens reuse them (one module: no extra retained tokens, kv_cache_planning.py:1742)."""
    return num_speculative_tokens > 0 and method is not None and (method == "mtp" or method.endswith("_mtp"))


def mtp_retained_tokens(modules: int, num_speculative_tokens: int, index_share: bool) -> int:
    """The tokens every sliding window retains past its own for an MTP draft of `modules` layers: with more
    than one module and more than one speculative token (and no index_share_for_mtp_iteration) vLLM drafts
    with MultiModuleMTPSpeculator, whose prefill lookahead is the k tokens, so the windows keep k - 1 more;
    any other MTP draft looks one token ahead, none more (vLLM 0.34.0, vllm/config/speculative.py:1813-1827,
    v1/worker/gpu/spec_decode/multi_module_mtp/config.py:13-18, speculator_config.py:122-125,
    v1/core/kv_cache_planning.py:1742-1748)."""
    multi = min(modules, num_speculative_tokens) > 1 and not index_share
    return num_speculative_tokens - 1 if multi else 0


def backend_name(sm_major: int) -> str:
    """The DSv4 attention backend CUDA picks without --attention-backend: FlashInfer's SM120 kernels on
    SM 12.x, FlashMLA elsewhere (vLLM 0.34.0, vllm/models/deepseek_v4/nvidia/model.py:567-570)."""
    return "FLASHINFER_MLA_SPARSE_DSV4" if sm_major == 12 else "FLASHMLA_SPARSE_DSV4"


def token_bytes(groups: Sequence[Group], block_size: int = MAIN_BLOCK) -> int:
    """Bytes a long context adds per token: the full-attention groups' pages over their block
    (the sliding groups hold a bounded window)."""
    return -(-sum(g.page_bytes for g in groups if g.kind in ("mla", "full")) // block_size)


# The layer classes whose caches this module plans (architecture_kinds.PLANNED_KINDS).
DEEPSEEK_V4_KINDS: dict[str, str] = {
    "DeepseekV4Attention": "DeepSeek-V4 sliding-window and compressed latents, compressor states",
    "DeepseekV4IndexerCache": "DeepSeek-V4 indexer keys"}
# Architectures that build those classes with caches of other shapes, which this module does not plan
# (none in vLLM 0.34: V4.1 is planner/deepseek_v41.py's, the DSpark drafts have planner/draft_heads.py's verdict,
# DeepSeek-V4's planned here with its target).
NOT_PLANNED: dict[str, str] = {}


# One MXFP4 value and its share of the UE8M0 scale per 32 values (OCP MX, as weights.py's mxfp4).
MXFP4_BYTES_PER_PARAM = 0.5 + 1 / 32


def weight_quantization(quantization: Mapping[str, Any] | None, cfg: Mapping[str, Any],
                        architectures: Sequence[str]) -> Mapping[str, Any] | None:
    """DeepSeek-V4's quantization_config as vLLM loads it: an "fp8" checkpoint becomes
    deepseek_v4_fp8 (vLLM 0.34.0, vllm/model_executor/models/config.py:763-769), whose routed experts
    take config.json's `expert_dtype` ("fp4" when unset): MXFP4 experts (Mxfp4MoEMethod), the other
    linear layers FP8 blocks (vllm/models/deepseek_v4/quant_config.py:60-109, :209-229). The expert
    dtype rides along as `expert_dtype` (weights.gpu_weights_bytes reads it)."""
    if quantization is None or not is_deepseek_v4(cfg.get("model_type"), architectures) \
            or str(quantization.get("quant_method", "")).lower() != "fp8":
        return quantization
    expert = cfg.get("expert_dtype", "fp4")
    return {**quantization, "expert_dtype": expert} if isinstance(expert, str) else quantization


@dataclass(frozen=True)
class Packing:
    """DeepSeek-V4's KV cache for one command: its groups, the shared block, the backend, and why the
    figures are unsure (empty: checked against vLLM's own code)."""

    groups: tuple[Group, ...]
    bytes_per_block: int
    backend: str | None
    unsure: tuple[str, ...]
    # what the plan reports: Step5 (planner/step5_sparse.py) packs its caches by the same rule
    attention: str = "deepseek_v4"
    block_size: int = MAIN_BLOCK
    source: str = SOURCE
    dtype_bytes: int = 1
    extra_retained: int = 0   # tokens every sliding window retains for a multi-module MTP draft (mtp_retained_tokens)
    drafted: bool = False   # the draft's layers planned are ModelGeometry.packed_draft's: its weights load too

    @property
    def kv_bytes_per_token(self) -> int:
        return token_bytes(self.groups, self.block_size)


def packing(shape: DeepseekV4Shape, speculative_method: str | None, num_speculative_tokens: int, platform: str,
            sm: str, version: VllmVersion | None, attention_backend: str | None = None) -> Packing:
    """The groups of a DeepSeek-V4 model under this command (MTP's or DSpark's layers where they draft)."""
    mtp, dspark = drafts_with_mtp(speculative_method, num_speculative_tokens), speculative_method == "dspark"
    groups = tuple(groups_for(shape, mtp, dspark))
    draft = "" if mtp or dspark or not speculative_method else (
        f"--speculative-config method {speculative_method!r}: its draft's KV cache is not planned for "
        f"DeepSeek-V4 (only MTP's and DSpark's layers are)")
    backend = backend_name(int(sm.split(".")[0])) if platform == "cuda" else None
    # FLASHINFER_MLA_SPARSE_DSV4 off SM 12.x takes plain rows (use_fp8_ds_mla_layout False,
    # nvidia/flashinfer_sparse.py:205), and other platforms have their own classes: not planned here.
    chosen = "" if backend is not None and attention_backend in (None, backend) else (
        f"DeepSeek-V4 with --attention-backend {attention_backend} on {platform} SM {sm}: only the fp8_ds_mla "
        f"layout CUDA picks by default is planned")
    return Packing(groups, bytes_per_block(groups), backend,
                   tuple(r for r in (unchecked_release(version), draft, chosen) if r), drafted=dspark)
