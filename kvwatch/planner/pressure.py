"""KV pressure, explained: which one flag change would relieve it, with its effect in the
planner's numbers (pure).

A KV cache under pressure shows as latency, not errors: vLLM preempts running requests when it
runs out of blocks (vllm:num_preemptions_total), and requests wait while the cache is full.
vLLM's docs list the moves (an fp8 KV cache, a higher --gpu-memory-utilization, a lower
--max-num-seqs, more tensor parallelism); this module chooses one for a given engine, in the order
of the table below, and keeps only a change the planner finds legal for that GPU, backend and
release (the re-plan of the changed command must predict no failure) and that improves what it
is for. The decision table (docs/serving.md has it too):

| # | when | change | expected effect |
|---|---|---|---|
| 1 | KV dtype is the model's (auto, bf16, fp16) | `--kv-cache-dtype fp8` | KV tokens x ~2 |
| 2 | a GPU with free memory NVML shows, KV sized by utilization | `--gpu-memory-utilization` up to what is free less a margin | KV tokens up |
| 3 | finished requests far shorter than max-model-len and a --max-num-seqs above what the cache holds of them | `--max-num-seqs` = KV tokens / mean request tokens | no preemption at that concurrency |
| 4 | the longest finished request under a quarter of max-model-len | `--max-model-len` = the next power of two above 1.25 x the longest | concurrency up (the figure vLLM logs) |
| 5 | unused GPUs on the host | `--tensor-parallel-size` x 2 | KV tokens per rank up |

A flag in `fixed` (a fleet's invariants: `--block-size`, the hash seed, ...) is never changed.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.plan import Plan

PREEMPTIONS_PER_MINUTE = 1.0   # sustained preemption: pressure
FULL = 0.9                     # KV usage at which waiting requests mean pressure
GPU_MARGIN_BYTES = 1 << 30     # free memory left to others (and CUDA's own growth) when raising utilization
MAX_UTILIZATION = 0.95
HALF_KV_DTYPES = frozenset({"auto", "bfloat16", "float16", "half"})


@dataclass(frozen=True)
class Window:
    """The engine's own series over one window (means, and increases of counters)."""
    seconds: float
    preemptions: float                       # new preemptions in the window
    kv_usage: float | None = None            # mean vllm:kv_cache_usage_perc, 0..1
    waiting: float | None = None             # mean vllm:num_requests_waiting
    mean_request_tokens: float | None = None  # prompt + generated tokens per finished request
    max_request_tokens: int | None = None     # the longest finished request (its bucket's upper bound)
    gpu_free_bytes: int | None = None         # NVML, on the engine's GPU
    gpus_unused: int = 0                      # GPUs of the host no engine holds
    generated_tokens: float | None = None     # new generated tokens in the window (throughput)

    @property
    def preemptions_per_minute(self) -> float:
        return self.preemptions * 60.0 / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float | None:
        if self.generated_tokens is None or self.seconds <= 0:
            return None
        return self.generated_tokens / self.seconds


@dataclass(frozen=True)
class Recommendation:
    change: FlagChange
    reason: str
    tokens_before: int
    tokens_after: int
    concurrency_before: float | None
    concurrency_after: float | None

    def to_json(self) -> dict[str, object]:
        return {"change": self.change.to_json(), "describe": self.change.describe(), "reason": self.reason,
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
                "concurrency_before": self.concurrency_before, "concurrency_after": self.concurrency_after}


def pressure(window: Window) -> str | None:
    """Why the window shows KV pressure; None when it does not."""
    if window.seconds <= 0:
        return None
    per_minute = window.preemptions_per_minute
    if per_minute >= PREEMPTIONS_PER_MINUTE:
        return f"{per_minute:.1f} preemptions per minute"
    if window.kv_usage is not None and window.kv_usage >= FULL and (window.waiting or 0) >= 1:
        return f"KV cache {window.kv_usage:.0%} full with {window.waiting:.1f} requests waiting"
    return None


def candidates(plan: Plan, settings: EngineSettings, window: Window) -> list[tuple[FlagChange, str]]:
    """The changes of the decision table that apply, in its order, each with why."""
    out: list[tuple[FlagChange, str]] = []
    if settings.kv_cache_dtype in HALF_KV_DTYPES:
        out.append((FlagChange({"--kv-cache-dtype": "fp8"}), "an fp8 KV cache holds twice the tokens"))
    total = plan.gpu_budget.cuda_total_bytes if plan.gpu_budget is not None else None
    if (window.gpu_free_bytes is not None and total and settings.kv_cache_memory_bytes is None
            and settings.num_gpu_blocks_override is None and window.gpu_free_bytes > GPU_MARGIN_BYTES):
        raised = min(MAX_UTILIZATION,
                     math.floor((settings.gpu_memory_utilization + (window.gpu_free_bytes - GPU_MARGIN_BYTES) / total)
                                * 100) / 100)
        if raised > settings.gpu_memory_utilization + 0.005:
            out.append((FlagChange({"--gpu-memory-utilization": f"{raised:.2f}"}),
                        f"NVML shows {window.gpu_free_bytes / (1 << 30):.1f} GiB free on the GPU"))
    mean = window.mean_request_tokens
    if mean and mean > 0:
        fits = max(1, plan.kv_cache_tokens // math.ceil(mean))
        current = settings.max_num_seqs or (plan.gpu_budget.max_num_seqs if plan.gpu_budget is not None else None)
        if current is None or fits < current:
            out.append((FlagChange({"--max-num-seqs": str(fits)}),
                        f"the cache holds {fits} requests of the {mean:.0f} tokens they take on average"))
    longest, limit = window.max_request_tokens, plan.max_model_len
    if longest and limit and longest * 4 <= limit and not settings.max_model_len_auto:
        shorter = 1 << max(0, math.ceil(math.log2(longest * 1.25)))
        if shorter < limit:
            out.append((FlagChange({"--max-model-len": str(shorter)}),
                        f"the longest request took {longest} tokens of the {limit} allowed"))
    if window.gpus_unused >= settings.tensor_parallel_size:
        out.append((FlagChange({"--tensor-parallel-size": str(settings.tensor_parallel_size * 2)}),
                    f"{window.gpus_unused} GPUs on the host are unused"))
    return out


def recommend(plan: Plan, settings: EngineSettings, window: Window,
              replan: Callable[[FlagChange], Plan | None], fixed: Sequence[str] = (),
              tried: Sequence[FlagChange] = ()) -> Recommendation | None:
    """The first change of the decision table that the planner finds legal and that improves what it
    is for; None without pressure or without such a change. `replan` plans the command with a change
    applied (None when it cannot be planned); `tried` are changes not to propose again (rolled back)."""
    why = pressure(window)
    if why is None:
        return None
    for change, because in candidates(plan, settings, window):
        if any(flag in change for flag in fixed) or change in tried:
            continue
        after = replan(change)
        if after is None or after.will_fail:
            continue
        if not _improves(change, plan, after):
            continue
        return Recommendation(change, f"{why}: {because}", plan.kv_cache_tokens, after.kv_cache_tokens,
                              plan.max_concurrency, after.max_concurrency)
    return None


def _improves(change: FlagChange, before: Plan, after: Plan) -> bool:
    if "--max-num-seqs" in change:
        return True          # fewer sequences at once: the same cache, no preemption at that concurrency
    if "--max-model-len" in change:
        return (after.max_concurrency or 0) > (before.max_concurrency or 0)
    return after.kv_cache_tokens > before.kv_cache_tokens
