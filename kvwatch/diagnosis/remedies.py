"""The one flag change that fixes a diagnosed failure, on top of the current command (pure).

propose_remedy() walks the options for the class in order and returns the first one that
policy allows and whose resulting argv has not been tried; None when nothing is left
(a fatal failure, a switched-off remedy, or every option tried).

Same-plan remedies (an empty FlagChange) mean "restart with the same argv". They are the only
remedies exempt from the `tried` check, and are returned in these cases, all handled by the
watchdog: ENGINE_DIED and STALLED (the engine was serving and crashed or stopped making progress:
restart it), KILLED (a signal kvwatch did not send), UNKNOWN (an exit no failure line names: a crash is
a restart, never a verdict), a first HOST_OOM in its phase (host_memory_remedies.py), and GPU_MEMORY_BUSY
when the memory is held by the watchdog's own processes (it ends them first) or has been
freed since the failure. The watchdog bounds them with policy.max_restarts.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.diagnosis.diagnose import Diagnosis, flag_fixable_backends, is_8bit_kv
from kvwatch.diagnosis.facts import (
    BackendFacts,
    BlockSizeFacts,
    ConfigRefusedFacts,
    CudaOomFacts,
    EngineContext,
    F,
    FailureFacts,
    GpuBusyFacts,
    HostOomFacts,
    KernelFacts,
    KvDtypeFacts,
    KvTooSmallFacts,
    LoraRankFacts,
    MambaCacheFacts,
    facts_as,
)
from kvwatch.diagnosis.host_memory_remedies import host_oom_options
from kvwatch.errors import KvwatchError
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.engine_args import EngineCommand, EngineSettings
from kvwatch.planner.extensible_kv import effective_utilization, extensible_for
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.plan import Plan
from kvwatch.planner.predicted_refusal import KV_CACHE_TOO_SMALL
from kvwatch.planner.rules import RuleSet, ruleset_for
from kvwatch.policy import Policy, fixed_among
from kvwatch.values.block_sizes import parse_block_rule, smallest_common_block_size
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import DEFAULT_RELEASE, resolve
from kvwatch.vllm_releases.release_defaults import api_batch_defaults, defaults_for
from kvwatch.vllm_releases.texts import LORA_RANKS

GiB = 2**30
SAME_PLAN_REASON = "restart with the same plan"
_FIT_MARGIN_RATIO, _FIT_MARGIN_BYTES = 0.02, 1 * GiB   # headroom left when fitting to free memory


@dataclass(frozen=True)
class Remedy:
    change: FlagChange          # empty: restart with the same plan
    reason: str

    def apply(self, command: EngineCommand) -> EngineCommand:
        return self.change.apply(command)

    @property
    def same_plan(self) -> bool:
        return self.change.empty

    def to_json(self) -> dict[str, Any]:
        return {**self.change.to_json(), "reason": self.reason}


@dataclass(frozen=True)
class GpuContext:
    """What the watchdog knows of the GPU now (NVML): free/total memory and who holds it."""

    free_bytes: int | None = None
    total_bytes: int | None = None
    holders: tuple[tuple[int, str, bool], ...] = ()   # (pid, name, is_ours)

    def has_room_for(self, utilization: float) -> bool | None:
        """Whether `utilization` x total fits in the free memory; None when unknown."""
        if not self.free_bytes or not self.total_bytes:
            return None
        return self.free_bytes >= utilization * self.total_bytes


@dataclass(frozen=True)
class _Ctx:
    """What one remedy search works from: the diagnosis, the command and the settings it reads as."""

    diagnosis: Diagnosis
    command: EngineCommand
    settings: EngineSettings
    policy: Policy
    plan: Plan | None
    gpu: GpuContext | None
    rules: RuleSet
    facts: FailureFacts          # the diagnosis' facts, typed for its class (diagnosis/facts.py)

    @property
    def context(self) -> EngineContext:
        return self.facts.context

    def facts_as(self, cls: type[F]) -> F:
        return facts_as(self.facts, cls)


def _as_logged(command: EngineCommand, release: str | None) -> EngineCommand:
    """The command read as the release the log's version line names (its defaults and semantics:
    an unset utilization is 1.0 under 0.34's extensible KV cache), where that release's parser reads it."""
    if release is None:
        return command
    try:
        logged = replace(command, release=str(resolve(parse_version(release)).used))
        logged.settings()
    except KvwatchError:
        return command
    return logged


def propose_remedy(diagnosis: Diagnosis, command: EngineCommand, *, policy: Policy = Policy(),
                   tried: Collection[tuple[str, ...]] = (), plan: Plan | None = None,
                   gpu: GpuContext | None = None, rules: RuleSet | None = None) -> Remedy | None:
    """The first allowed, untried change that fixes `diagnosis`; None when there is none."""
    if diagnosis.fatal:
        return None
    options = _OPTIONS.get(diagnosis.kind)
    if options is None:
        return None
    command = _as_logged(command, diagnosis.release)
    ctx = _Ctx(diagnosis, command, command.settings(), policy, plan, gpu, rules or ruleset_for(None),
               diagnosis.typed_facts)
    seen = {tuple(t) for t in tried}
    for remedy in options(ctx):
        if fixed_among(policy, remedy.change.flags):
            continue   # a fleet invariant (policy.fixed_flags): the next option that keeps it
        if remedy.same_plan:
            return remedy
        argv = remedy.apply(command).argv
        if argv == command.argv or argv in seen:
            continue
        return remedy
    return None


# -- block size --------------------------------------------------------------------------

def _current_block_size(ctx: _Ctx) -> int | None:
    for value in (ctx.facts_as(BlockSizeFacts).block_size, ctx.facts_as(BackendFacts).selector_block_size,
                  ctx.settings.block_size, ctx.plan.block_size if ctx.plan else None, ctx.context.block_size):
        if isinstance(value, int):
            return value
    return None


def _backend_names(ctx: _Ctx) -> list[str]:
    facts = ctx.facts_as(BlockSizeFacts)
    names = list(facts.backend_block_sizes) + list(facts.backends)
    for extra in (ctx.plan.backend if ctx.plan else None, ctx.context.attention_backend,
                  ctx.settings.attention_backend):
        if extra:
            names.append(extra)
    return [n for n in dict.fromkeys(names) if ctx.rules.backend(n) is not None]


def _block_size_options(ctx: _Ctx) -> Iterator[Remedy]:
    if not ctx.policy.allow_block_size_change:
        return
    current = _current_block_size(ctx)
    spec = ctx.facts_as(BlockSizeFacts).backend_block_sizes
    if current is not None and spec:
        per_backend = [[r for r in map(parse_block_rule, rules) if r is not None] for rules in spec.values()]
        size = smallest_common_block_size(per_backend, current)
        if size is not None and size != current:
            accepted = "; ".join(f"{name}: [{', '.join(map(str, rules))}]" for name, rules in spec.items())
            yield Remedy(FlagChange({"--block-size": size}),
                         f"block size {current} is not accepted ({accepted}); {size} is the smallest "
                         f"legal size >= {current}")
    if current is not None:
        for name in _backend_names(ctx):
            rule = ctx.rules.backend(name)
            assert rule is not None
            if rule.forced_block_size is not None:
                continue
            size = rule.smallest_block_size_at_least(current)
            if size != current and rule.supports_block_size(size):
                sizes = ", ".join(map(str, rule.block_sizes))
                yield Remedy(FlagChange({"--block-size": size}),
                             f"block size {current} is not accepted by {name} ([{sizes}], kvwatch's rule "
                             f"table); {size} is the smallest legal size >= {current}")
    if ctx.command.has("--block-size"):
        yield Remedy(FlagChange(remove=("--block-size",)), "no legal block size is known: let vLLM pick the backend's own")


# -- KV cache dtype ----------------------------------------------------------------------

def _effective_kv_dtype(ctx: _Ctx) -> str | None:
    if ctx.settings.kv_cache_dtype != "auto":
        return ctx.settings.kv_cache_dtype
    for value in (ctx.context.kv_cache_dtype, ctx.facts_as(KvDtypeFacts).kv_cache_dtype,
                  ctx.plan.kv_cache_dtype if ctx.plan else None):
        if value and value != "auto":
            return str(value)
    return "auto"


def _kv_dtype_fix(ctx: _Ctx, why: str) -> Iterator[Remedy]:
    if not ctx.policy.allow_kv_dtype_change:
        return
    if ctx.settings.kv_cache_dtype != "auto":
        yield Remedy(FlagChange({"--kv-cache-dtype": "auto"}), f"{why}: store the KV cache in the model's dtype")
        return
    effective = _effective_kv_dtype(ctx)
    if effective and is_8bit_kv(effective):
        half = ctx.settings.dtype if ctx.settings.dtype in ("float16", "half", "bfloat16") else "bfloat16"
        yield Remedy(FlagChange({"--kv-cache-dtype": half}),
                     f"{why}: the engine chose a {effective} KV cache by itself (from the checkpoint); "
                     f"ask for {half} explicitly")


def _kv_dtype_options(ctx: _Ctx) -> Iterator[Remedy]:
    yield from _kv_dtype_fix(ctx, "this KV cache dtype is not supported here")


def _kernel_options(ctx: _Ctx) -> Iterator[Remedy]:
    # A kernel's shared-memory limit: the tiles are not --block-size. Only a bf16/fp16 KV cache
    # (smaller tiles with 2 stages) gets under it; nothing else is proposed.
    if is_8bit_kv(_effective_kv_dtype(ctx)):
        facts = ctx.facts_as(KernelFacts)
        required, limit = facts.required_bytes, facts.hardware_limit_bytes
        numbers = f" ({required:,} B needed, {limit:,} B available)" if required and limit else ""
        yield from _kv_dtype_fix(ctx, f"a kernel ran out of {facts.resource or 'resources'}"
                                      f"{numbers} with an 8-bit KV cache")


# -- memory ------------------------------------------------------------------------------

def _utilization(ctx: _Ctx) -> float:
    """The utilization the engine sized against (planner/extensible_kv.effective_utilization): an
    unset flag is 1.0 under vLLM 0.34's extensible KV cache, not the estimate default."""
    platform = "cpu" if ctx.plan is not None and ctx.plan.device.lower().startswith("cpu") else "cuda"
    return effective_utilization(ctx.settings, platform, defaults_for(parse_version(ctx.command.release)))


def _unset_utilization(ctx: _Ctx, why: str) -> Iterator[Remedy]:
    """Under the extensible KV cache an explicit utilization below 1.0 is a cap: leaving it unset
    gives the cache what is measured free after warm-up (vLLM 0.34.0, vllm/config/cache.py:495-501)."""
    platform = "cpu" if ctx.plan is not None and ctx.plan.device.lower().startswith("cpu") else "cuda"
    release = defaults_for(parse_version(ctx.command.release))
    sizing = extensible_for(ctx.settings, platform, release).sizing
    given = ctx.settings.gpu_memory_utilization
    if sizing is None or not ctx.settings.gpu_memory_utilization_given or given >= sizing.utilization:
        return
    yield Remedy(FlagChange(remove=("--gpu-memory-utilization",)),
                 f"{why}: --gpu-memory-utilization {given} caps vLLM {release.release}'s extensible KV cache; "
                 f"unset it means {sizing.utilization}, the cache sized from the memory free after warm-up")


def _raise_utilization(ctx: _Ctx, why: str) -> Iterator[Remedy]:
    if not ctx.policy.allow_gpu_memory_utilization_change:
        return
    yield from _unset_utilization(ctx, why)
    current = _utilization(ctx)
    step, cap = ctx.policy.gpu_memory_utilization_step, ctx.policy.max_gpu_memory_utilization
    value = current
    while True:
        value = round(min(value + step, cap), 2)
        if value <= current + 1e-9:
            return
        if ctx.gpu is not None and ctx.gpu.has_room_for(value) is False:
            return
        yield Remedy(FlagChange({"--gpu-memory-utilization": value}),
                     f"{why}: raise GPU memory utilization {current} -> {value} (policy cap {cap})")
        if value >= cap:
            return


def _lower_utilization(ctx: _Ctx, why: str) -> Iterator[Remedy]:
    if not ctx.policy.allow_gpu_memory_utilization_change:
        return
    current = _utilization(ctx)
    step, floor_ = ctx.policy.gpu_memory_utilization_step, ctx.policy.min_gpu_memory_utilization
    value = current
    while True:
        value = round(max(value - step, floor_), 2)
        if value >= current - 1e-9:
            return
        yield Remedy(FlagChange({"--gpu-memory-utilization": value}),
                     f"{why}: lower GPU memory utilization {current} -> {value} (policy floor {floor_})")
        if value <= floor_:
            return


def _kv_too_small_options(ctx: _Ctx) -> Iterator[Remedy]:
    facts = ctx.facts_as(KvTooSmallFacts)
    current = facts.max_model_len or ctx.settings.max_model_len
    if ctx.policy.allow_max_model_len_change:
        estimate = facts.estimated_max_model_len
        block = ctx.plan.block_size if ctx.plan else ctx.settings.block_size
        if isinstance(estimate, int) and estimate > 0:
            value = estimate // block * block if block else estimate
            if value > 0 and (current is None or value < current):
                rounded = f", rounded down to block size {block}" if block and value != estimate else ""
                yield Remedy(FlagChange({"--max-model-len": value}),
                             f"max model len {current} does not fit the KV cache; the engine's estimate of "
                             f"what fits is {estimate}{rounded}")
        if ctx.plan is not None:
            for w in ctx.plan.warnings:
                fit = w.fix.set.get("--max-model-len") if w.kind == KV_CACHE_TOO_SMALL else None
                if isinstance(fit, int) and fit > 0 and (current is None or fit < current):
                    yield Remedy(FlagChange({"--max-model-len": fit}), f"from the plan: {w.message}")
    yield from _raise_utilization(ctx, f"max model len {current} does not fit the KV cache")


def _mamba_cache_options(ctx: _Ctx) -> Iterator[Remedy]:
    facts = ctx.facts_as(MambaCacheFacts)
    blocks = facts.mamba_blocks
    if isinstance(blocks, int) and blocks > 0:
        yield Remedy(FlagChange({"--max-num-seqs": blocks}),
                     f"max num seqs {facts.max_num_seqs} exceeds the {blocks} Mamba cache blocks "
                     f"(one per decoding sequence): lower --max-num-seqs to {blocks}")
    yield from _raise_utilization(ctx, "the Mamba cache has fewer blocks than max num seqs")


def _no_memory_options(ctx: _Ctx) -> Iterator[Remedy]:
    # The plan gives --max-num-seqs only where no utilization up to 0.95 leaves KV blocks and the
    # profile's peak falls with fewer dummy sequences (planner/plan.py _no_memory_warning): first.
    for warning in ctx.plan.warnings if ctx.plan is not None else ():
        if warning.kind == FailureKind.NO_KV_CACHE_MEMORY and "--max-num-seqs" in warning.fix.set:
            yield Remedy(warning.fix, f"no memory is left for KV cache blocks, and the plan's memory profile peaks "
                                      f"with the dummy sequences: --max-num-seqs {warning.fix.set['--max-num-seqs']}")
    yield from _raise_utilization(ctx, "no memory is left for KV cache blocks")


def _default_max_num_seqs(ctx: _Ctx) -> int:
    """vLLM's default max_num_seqs: the plan's (its release, its card), else the newest release's
    tier for the card's memory (vllm_releases/defaults.py); the sampler warm-up message names the
    real count anyway."""
    if ctx.plan is not None and ctx.plan.gpu_budget is not None:
        return ctx.plan.gpu_budget.max_num_seqs
    total = ctx.gpu.total_bytes if ctx.gpu is not None and ctx.gpu.total_bytes else 0
    return api_batch_defaults(defaults_for(DEFAULT_RELEASE), "cuda", total, "", None, 1)[1]


def _cuda_oom_options(ctx: _Ctx) -> Iterator[Remedy]:
    facts = ctx.facts_as(CudaOomFacts)
    if facts.phase == "sampler_warmup":
        current = ctx.settings.max_num_seqs or facts.dummy_requests or _default_max_num_seqs(ctx)
        value = max(1, int(current) // 2)
        if value < current:
            yield Remedy(FlagChange({"--max-num-seqs": value}),
                         f"CUDA ran out of memory warming up the sampler with {current} requests: "
                         f"halve --max-num-seqs {current} -> {value}")
    where = {"sampler_warmup": "in the sampler warm-up", "model_load": "loading the model"}.get(
        facts.phase or "", "")
    yield from _lower_utilization(ctx, f"CUDA ran out of memory {where}".rstrip())


def _busy_options(ctx: _Ctx) -> Iterator[Remedy]:
    holders = ctx.gpu.holders if ctx.gpu else ()
    ours = [h for h in holders if h[2]]
    if ours:
        names = ", ".join(f"{pid} ({name})" for pid, name, _ in ours)
        yield Remedy(NO_CHANGE, f"our own processes hold the GPU: {names}; end them, then {SAME_PLAN_REASON}")
        return
    if ctx.gpu is not None and ctx.gpu.free_bytes and ctx.gpu.total_bytes:
        free, total = ctx.gpu.free_bytes, ctx.gpu.total_bytes
    elif (said := ctx.facts_as(GpuBusyFacts)).free_gib and said.total_gib:
        free, total = int(said.free_gib * GiB), int(said.total_gib * GiB)
    else:
        return
    current = _utilization(ctx)
    margin = max(_FIT_MARGIN_RATIO, _FIT_MARGIN_BYTES / total)
    fitted = math.floor((free / total - margin) * 100 + 1e-9) / 100
    others = ", ".join(f"{pid} ({name})" for pid, name, _ in holders) or "unknown processes"
    if fitted >= current:
        yield Remedy(NO_CHANGE, f"the GPU has room again ({free / GiB:.2f}/{total / GiB:.2f} GiB free): "
                             f"{SAME_PLAN_REASON}")
        return
    if not ctx.policy.allow_gpu_memory_utilization_change:
        return
    fitted = min(fitted, ctx.policy.max_gpu_memory_utilization)
    if fitted < ctx.policy.min_gpu_memory_utilization:
        return
    yield Remedy(FlagChange({"--gpu-memory-utilization": fitted}),
                 f"{others} hold the GPU; {free / GiB:.2f} of {total / GiB:.2f} GiB is free: fit GPU memory "
                 f"utilization {current} -> {fitted}")


# -- attention backend -------------------------------------------------------------------

def _backend_options(ctx: _Ctx) -> Iterator[Remedy]:
    facts = ctx.facts_as(BackendFacts)
    reasons = facts.reasons
    for name in flag_fixable_backends(reasons):
        change: dict[str, object] = {}
        remove: list[str] = []
        text = " ".join(reasons[name]).lower()
        if "dtype" in text or "fp8" in text:
            fix = next(_kv_dtype_fix(ctx, "x"), None)
            if fix is None:
                continue
            change.update(fix.change.set)
        if "block_size" in text:
            if not ctx.policy.allow_block_size_change:
                continue
            rule = ctx.rules.backend(name)
            current = _current_block_size(ctx)
            if rule is not None and current is not None and rule.forced_block_size is None:
                change["--block-size"] = rule.smallest_block_size_at_least(current)
            elif ctx.command.has("--block-size"):
                remove.append("--block-size")
            else:
                continue
        combined = FlagChange(change, tuple(remove))
        if not combined.empty:
            yield Remedy(combined, f"{name} was rejected only for {', '.join(reasons[name])}: {combined.describe()}")
    if facts.pattern == "selected_backend_invalid" and ctx.command.has("--attention-backend"):
        yield Remedy(FlagChange(remove=("--attention-backend",)),
                     f"the forced backend {ctx.settings.attention_backend} is not valid here: let vLLM choose")


# -- vLLM's refusals of its configuration (diagnosis/refusals.py) ----------------------------

def _config_refused_options(ctx: _Ctx) -> Iterator[Remedy]:
    f = ctx.facts_as(ConfigRefusedFacts)
    refusal = f.refusal
    if refusal == "max_model_len_above_derived" and ctx.policy.allow_max_model_len_change:
        # vLLM accepts up to the larger of the derived length and model_max_length. Never
        # VLLM_ALLOW_LONG_MAX_MODEL_LEN: vLLM itself warns that positions past it give NaN or worse.
        limit = max(f.derived_max_model_len or 0, f.model_max_length or 0)
        if limit > 0:
            yield Remedy(FlagChange({"--max-model-len": limit}),
                         f"max model len {f.max_model_len} is above the model's maximum "
                         f"({f.derived_key or 'config.json'}={limit}): set it to {limit}")
    elif refusal == "max_num_batched_tokens_below_max_model_len" and ctx.policy.allow_max_num_batched_tokens_change:
        if f.max_model_len is not None:
            value = f.max_model_len
            yield Remedy(FlagChange({"--max-num-batched-tokens": value}),
                         f"with chunked prefill off, one step must hold a whole prompt: raise max num batched "
                         f"tokens {f.max_num_batched_tokens} -> {value} (the max model len)")
    elif refusal == "max_num_batched_tokens_below_max_num_seqs" and ctx.policy.allow_max_num_batched_tokens_change:
        if f.max_num_seqs is not None:
            value = f.max_num_seqs
            yield Remedy(FlagChange({"--max-num-batched-tokens": value}),
                         f"max num batched tokens {f.max_num_batched_tokens} is below max num seqs {value}: "
                         f"raise it to {value}")
    elif refusal == "field:gpu_memory_utilization" and ctx.policy.allow_gpu_memory_utilization_change:
        given = f.value
        if isinstance(given, (int, float)) and given > 1:
            cap = ctx.policy.max_gpu_memory_utilization
            yield Remedy(FlagChange({"--gpu-memory-utilization": cap}),
                         f"GPU memory utilization is a fraction of the GPU (at most 1), {given} was given: "
                         f"{cap} (policy cap)")
        elif ctx.command.has("--gpu-memory-utilization"):
            yield Remedy(FlagChange(remove=("--gpu-memory-utilization",)),
                         f"GPU memory utilization {given} is not a fraction in (0, 1]: vLLM's default")
    elif refusal == "extensible_kv_cache_unsupported" and ctx.command.has("--enable-extensible-kv-cache"):
        yield Remedy(FlagChange(remove=("--enable-extensible-kv-cache",)),
                     f"vLLM cannot size this KV cache after warm-up ({f.sentence}): drop "
                     f"--enable-extensible-kv-cache and let it size the cache from its profile")
    elif refusal == "field:block_size" and ctx.policy.allow_block_size_change and ctx.command.has("--block-size"):
        yield Remedy(FlagChange(remove=("--block-size",)),
                     f"block size {f.value} is refused ({f.sentence}): let vLLM pick the "
                     f"attention backend's own")


def lora_rank_choices() -> tuple[int, ...]:
    """The --max-lora-rank values of the newest release kvwatch read (vllm_releases/texts.py)."""
    newest = max(LORA_RANKS, key=lambda r: tuple(int(p) for p in r.split(".")[:3] if p.isdigit()))
    return LORA_RANKS[newest][0]


def _lora_rank_options(ctx: _Ctx) -> Iterator[Remedy]:
    facts = ctx.facts_as(LoraRankFacts)
    rank = facts.lora_rank
    if not isinstance(rank, int):
        return
    # vLLM takes only listed values for --max-lora-rank: the smallest one that holds the adapter.
    value = next((r for r in lora_rank_choices() if r >= rank), None)
    if value is not None:
        yield Remedy(FlagChange({"--max-lora-rank": value}),
                     f"an adapter of rank {rank} is above max_lora_rank {facts.max_lora_rank}: "
                     f"--max-lora-rank {value}")


def _engine_died_options(ctx: _Ctx) -> Iterator[Remedy]:
    yield Remedy(NO_CHANGE, SAME_PLAN_REASON)


def _killed_options(ctx: _Ctx) -> Iterator[Remedy]:
    yield Remedy(NO_CHANGE, f"a kill from outside says nothing against the plan: {SAME_PLAN_REASON}")


def _port_freed_options(ctx: _Ctx) -> Iterator[Remedy]:
    # Only when nothing listens on the port any more (recovery.port_verdict): a holder is fatal.
    yield Remedy(NO_CHANGE, f"the port was taken only for a moment: {SAME_PLAN_REASON}, within the restart budget")


def _unknown_options(ctx: _Ctx) -> Iterator[Remedy]:
    # No failure line names a cause: no flag is known to help, and a crash is not a verdict.
    yield Remedy(NO_CHANGE, f"no failure line names a cause: {SAME_PLAN_REASON}, within the restart budget")


def _host_oom_options(ctx: _Ctx) -> Iterator[Remedy]:
    for change, reason in host_oom_options(ctx.command, ctx.facts_as(HostOomFacts)):
        yield Remedy(change, reason)


_OPTIONS = {
    FailureKind.BLOCK_SIZE_UNSUPPORTED: _block_size_options,
    FailureKind.KV_DTYPE_UNSUPPORTED: _kv_dtype_options,
    FailureKind.KERNEL_OUT_OF_RESOURCES: _kernel_options,
    FailureKind.KV_CACHE_TOO_SMALL: _kv_too_small_options,
    FailureKind.NO_KV_CACHE_MEMORY: _no_memory_options,
    FailureKind.MAMBA_CACHE_TOO_SMALL: _mamba_cache_options,
    FailureKind.CUDA_OOM: _cuda_oom_options,
    FailureKind.GPU_MEMORY_BUSY: _busy_options,
    FailureKind.NO_ATTENTION_BACKEND: _backend_options,
    FailureKind.ENGINE_DIED: _engine_died_options,
    FailureKind.STALLED: _engine_died_options,      # a wedged kernel or worker: restarted as it is
    FailureKind.KILLED: _killed_options,
    FailureKind.PORT_IN_USE: _port_freed_options,
    FailureKind.UNKNOWN: _unknown_options,
    FailureKind.HOST_OOM: _host_oom_options,
    FailureKind.CONFIG_REFUSED: _config_refused_options,
    FailureKind.LORA_RANK_TOO_LARGE: _lora_rank_options,
}
