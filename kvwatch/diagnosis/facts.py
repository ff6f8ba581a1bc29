"""What a diagnosis found, typed per failure class: what the remedies and the watchdog read (pure).

The scanner reports its facts as plain JSON values (`Diagnosis.facts`: what `kvwatch diagnose
--json` prints and the state file keeps); `facts_of` reads them once into the frozen value of the
diagnosis' class, so a misspelled fact is a type error, not a silent None. Every value is checked
for its type as it is read: a fact of another type (a hand-written diagnosis, a mangled number)
reads as absent, as the remedies' own checks treated it before.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvwatch.failure_kinds import FailureKind

JsonFacts = dict[str, Any]     # the facts as the scanner reports them (plain JSON values)
BlockRules = tuple[int | str, ...]   # a backend's block sizes as vLLM prints them: 16 or "MultipleOf(16)"


def _int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None


def _mapping(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    return value if isinstance(value, Mapping) else {}


def _names(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key)
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def _block_rules(data: Mapping[str, Any], key: str) -> Mapping[str, BlockRules]:
    return {str(name): tuple(rules) for name, rules in _mapping(data, key).items()
            if isinstance(rules, (list, tuple))}


@dataclass(frozen=True)
class EngineContext:
    """The engine's own account of its settings, as its log gave it (the scanner's "context")."""

    block_size: int | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineContext:
        return cls(_int(data, "block_size"), _str(data, "kv_cache_dtype"), _str(data, "attention_backend"))


@dataclass(frozen=True)
class FailureFacts:
    """What every diagnosis may say: the wording that named it and the engine's context."""

    pattern: str | None = None                 # the patterns.py wording that named the class
    context: EngineContext = field(default_factory=EngineContext)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailureFacts:
        return cls(**cls._common(data))

    @staticmethod
    def _common(data: Mapping[str, Any]) -> dict[str, Any]:
        return {"pattern": _str(data, "pattern"), "context": EngineContext.from_json(_mapping(data, "context"))}


@dataclass(frozen=True)
class BlockSizeFacts(FailureFacts):
    """block_size_unsupported: the size refused and what the backends accept."""

    block_size: int | None = None
    backend_block_sizes: Mapping[str, BlockRules] = field(default_factory=dict)
    backends: tuple[str, ...] = ()             # backends named without their sizes

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BlockSizeFacts:
        return cls(**cls._common(data), block_size=_int(data, "block_size"),
                   backend_block_sizes=_block_rules(data, "backend_block_sizes"), backends=_names(data, "backends"))


@dataclass(frozen=True)
class KvDtypeFacts(FailureFacts):
    """kv_cache_dtype_unsupported: the KV cache dtype refused."""

    kv_cache_dtype: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KvDtypeFacts:
        return cls(**cls._common(data), kv_cache_dtype=_str(data, "kv_cache_dtype"))


@dataclass(frozen=True)
class KernelFacts(FailureFacts):
    """kernel_out_of_resources: the resource a kernel ran out of, with its figures when printed."""

    resource: str | None = None
    required_bytes: int | None = None
    hardware_limit_bytes: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelFacts:
        return cls(**cls._common(data), resource=_str(data, "resource"), required_bytes=_int(data, "required_bytes"),
                   hardware_limit_bytes=_int(data, "hardware_limit_bytes"))


@dataclass(frozen=True)
class KvTooSmallFacts(FailureFacts):
    """kv_cache_too_small: the max model len asked for and the engine's estimate of what fits."""

    max_model_len: int | None = None
    estimated_max_model_len: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KvTooSmallFacts:
        return cls(**cls._common(data), max_model_len=_int(data, "max_model_len"),
                   estimated_max_model_len=_int(data, "estimated_max_model_len"))


@dataclass(frozen=True)
class MambaCacheFacts(FailureFacts):
    """mamba_cache_too_small: the sequences asked for and the Mamba cache blocks there are."""

    max_num_seqs: int | None = None
    mamba_blocks: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MambaCacheFacts:
        return cls(**cls._common(data), max_num_seqs=_int(data, "max_num_seqs"),
                   mamba_blocks=_int(data, "mamba_blocks"))


@dataclass(frozen=True)
class CudaOomFacts(FailureFacts):
    """cuda_oom: when it ran out ("sampler_warmup", "model_load") and torch's figures."""

    phase: str | None = None
    dummy_requests: int | None = None          # the sampler warm-up's requests
    free_gib: float | None = None
    total_gib: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CudaOomFacts:
        return cls(**cls._common(data), phase=_str(data, "phase"), dummy_requests=_int(data, "dummy_requests"),
                   free_gib=_float(data, "free_gib"), total_gib=_float(data, "total_gib"))


@dataclass(frozen=True)
class GpuBusyFacts(FailureFacts):
    """gpu_memory_busy: the free and total memory vLLM saw at start."""

    free_gib: float | None = None
    total_gib: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuBusyFacts:
        return cls(**cls._common(data), free_gib=_float(data, "free_gib"), total_gib=_float(data, "total_gib"))


@dataclass(frozen=True)
class BackendFacts(FailureFacts):
    """no_attention_backend: why each backend was rejected, and the selector's block size."""

    reasons: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    selector_block_size: int | None = None     # the block size the selector was asked for

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BackendFacts:
        reasons = {str(name): tuple(str(r) for r in why) for name, why in _mapping(data, "reasons").items()
                   if isinstance(why, (list, tuple))}
        return cls(**cls._common(data), reasons=reasons,
                   selector_block_size=_int(_mapping(data, "selector_config"), "block_size"))


@dataclass(frozen=True)
class ConfigRefusedFacts(FailureFacts):
    """config_refused: which of vLLM's validations refused (diagnosis/refusals.py) and its figures."""

    refusal: str | None = None                 # refusals.py's name for it ("field:block_size", ...)
    sentence: str | None = None
    value: int | float | str | None = None     # a refused field's value
    max_model_len: int | None = None
    derived_max_model_len: int | None = None
    derived_key: str | None = None             # the config.json key the derived length comes from
    model_max_length: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConfigRefusedFacts:
        value = data.get("value")
        return cls(**cls._common(data), refusal=_str(data, "refusal"), sentence=_str(data, "sentence"),
                   value=value if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None,
                   max_model_len=_int(data, "max_model_len"), derived_max_model_len=_int(data, "derived_max_model_len"),
                   derived_key=_str(data, "derived_key"), model_max_length=_int(data, "model_max_length"),
                   max_num_batched_tokens=_int(data, "max_num_batched_tokens"),
                   max_num_seqs=_int(data, "max_num_seqs"))


@dataclass(frozen=True)
class LoraRankFacts(FailureFacts):
    """lora_rank_too_large: the adapter's rank and the engine's --max-lora-rank."""

    lora_rank: int | None = None
    max_lora_rank: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoraRankFacts:
        return cls(**cls._common(data), lora_rank=_int(data, "lora_rank"), max_lora_rank=_int(data, "max_lora_rank"))


@dataclass(frozen=True)
class HostOomFacts(FailureFacts):
    """host_oom: the kernel's OOM killer ended the engine; how often before in the same phase, and the host."""

    repeats: int = 0                           # earlier host OOM kills of this plan in the same phase
    phase: str | None = None                   # "starting" or "serving"
    host_memory_bytes: int | None = None       # what the host (or the engine's cgroup limit) holds

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostOomFacts:
        return cls(**cls._common(data), repeats=_int(data, "repeats") or 0, phase=_str(data, "phase"),
                   host_memory_bytes=_int(data, "host_memory_bytes"))


_BY_KIND: dict[FailureKind, type[FailureFacts]] = {
    FailureKind.BLOCK_SIZE_UNSUPPORTED: BlockSizeFacts,
    FailureKind.KV_DTYPE_UNSUPPORTED: KvDtypeFacts,
    FailureKind.KERNEL_OUT_OF_RESOURCES: KernelFacts,
    FailureKind.KV_CACHE_TOO_SMALL: KvTooSmallFacts,
    FailureKind.MAMBA_CACHE_TOO_SMALL: MambaCacheFacts,
    FailureKind.CUDA_OOM: CudaOomFacts,
    FailureKind.GPU_MEMORY_BUSY: GpuBusyFacts,
    FailureKind.NO_ATTENTION_BACKEND: BackendFacts,
    FailureKind.CONFIG_REFUSED: ConfigRefusedFacts,
    FailureKind.LORA_RANK_TOO_LARGE: LoraRankFacts,
    FailureKind.HOST_OOM: HostOomFacts,
}

F = TypeVar("F", bound=FailureFacts)


def facts_of(kind: FailureKind, data: Mapping[str, Any]) -> FailureFacts:
    """The typed facts of a diagnosis of class `kind` (FailureFacts for a class no remedy reads)."""
    return _BY_KIND.get(kind, FailureFacts).from_json(data)


def facts_as(facts: FailureFacts, cls: type[F]) -> F:
    """`facts` as the class's own type; that type's empty facts when they are another class's."""
    return facts if isinstance(facts, cls) else cls()
