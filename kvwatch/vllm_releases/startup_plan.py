"""vLLM's own persisted start-up plan, as kvwatch reads it (pure).

With VLLM_ENABLE_STARTUP_PLAN=1 (vLLM 0.26+, vllm/v1/worker/startup_plan.py) each worker stores its
profiled `--kv-cache-memory` value in {VLLM_CACHE_ROOT}/startup_plan/startup_plan_<fingerprint>.json:
    {"schema": 1, "fingerprint": "<16 hex>", "kv_cache_memory_bytes": N, "free_memory_baseline": M}
(vLLM 0.32.0, vllm/v1/worker/startup_plan.py:179, maybe_save_startup_plan, the same from 0.26.0; the value is its
"fits the requested memory" figure, vllm/v1/worker/gpu_worker.py:1036). A later boot whose fingerprint
matches and whose free memory is at least the baseline applies N and skips the memory profile: it then
logs neither "Available KV cache memory" nor the profile's suggestion, but
    "Applying persisted startup plan (fingerprint F): kv_cache_memory_bytes=N (x GiB), ..."
(startup_plan.py:154). The fingerprint hashes vLLM's whole config, which kvwatch cannot rebuild: the
plan a boot used is known from its log line, the file from the "Saved startup plan to PATH" line.

A pinned --kv-cache-memory-bytes makes vLLM skip its plan (maybe_apply_startup_plan returns when the
value is set) and never save one (the save is on the profiling path only): so where the engine keeps
its own plan kvwatch does not pin over it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kvwatch.values.json_text import parse_json
from kvwatch.vllm_releases.defaults_shape import ReleaseDefaults

ENABLE_ENV = "VLLM_ENABLE_STARTUP_PLAN"
APPLIED_MARKER = "Applying persisted startup plan"
SAVED_MARKER = "Saved startup plan to "
MARKERS = (APPLIED_MARKER, SAVED_MARKER)
_APPLIED = re.compile(r"Applying persisted startup plan \(fingerprint ([0-9a-f]{1,64})\): "
                      r"kv_cache_memory_bytes=(\d{1,16})\b")
_SAVED = re.compile(r"Saved startup plan to (\S{1,4096}startup_plan_[0-9a-f]{1,64}\.json)\s*$")
MAX_PLAN_BYTES = 4096   # a plan is four fields


@dataclass(frozen=True)
class PersistedPlan:
    fingerprint: str
    kv_cache_memory_bytes: int
    free_memory_baseline: int


@dataclass(frozen=True)
class PlanLine:
    """One start-up line about vLLM's plan: the value a boot applied, or where it saved one."""
    applied_kv_bytes: int | None = None
    fingerprint: str | None = None
    saved_path: str | None = None


def parse_plan_line(line: str) -> PlanLine | None:
    if APPLIED_MARKER in line and (m := _APPLIED.search(line)):
        return PlanLine(applied_kv_bytes=int(m[2]), fingerprint=m[1])
    if SAVED_MARKER in line and (m := _SAVED.search(line)):
        return PlanLine(saved_path=m[1])
    return None


def parse_plan_file(data: bytes, schema: int = 1) -> PersistedPlan:
    """A plan file as vLLM's _load_plan and _applicable_kv_cache_memory_bytes accept it; ValueError
    for anything vLLM would ignore (another schema, a missing or non-positive value)."""
    if len(data) > MAX_PLAN_BYTES:
        raise ValueError(f"larger than {MAX_PLAN_BYTES} bytes: not a vLLM start-up plan")
    try:
        plan = parse_json(data.decode("utf-8"))
    except ValueError as exc:   # UnicodeDecodeError, malformed or too deeply nested JSON
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(plan, dict) or plan.get("schema") != schema:
        raise ValueError(f"not a vLLM start-up plan of schema {schema}")
    fingerprint, kv, baseline = plan.get("fingerprint"), plan.get("kv_cache_memory_bytes"), \
        plan.get("free_memory_baseline")
    if not isinstance(fingerprint, str) or not isinstance(kv, int) or not isinstance(baseline, int) \
            or isinstance(kv, bool) or isinstance(baseline, bool) or kv <= 0:
        raise ValueError("a start-up plan without its fingerprint, KV bytes or free-memory baseline")
    return PersistedPlan(fingerprint, kv, baseline)


def plan_enabled(defaults: ReleaseDefaults, env_value: str | None) -> bool:
    """Whether the engine keeps its own start-up plan: the release has one and envs.py's
    bool(int(VLLM_ENABLE_STARTUP_PLAN)) is true."""
    if not defaults.startup_plan_schema or env_value is None:
        return False
    try:
        return int(env_value.strip()) != 0
    except ValueError:
        return False


@dataclass(frozen=True)
class PinDecision:
    pin: bool
    reason: str


def pin_decision(enabled: bool, learned_kv_bytes: int, persisted: PersistedPlan | None) -> PinDecision:
    """Whether kvwatch may pin --kv-cache-memory-bytes to what it learned: never over vLLM's own plan,
    and say so where the two disagree."""
    if not enabled:
        return PinDecision(True, "")
    if persisted is None:
        return PinDecision(False, f"{ENABLE_ENV}=1: the engine profiles and keeps its own start-up plan; "
                                  "kvwatch does not pin over it")
    gap = learned_kv_bytes - persisted.kv_cache_memory_bytes
    disagree = f"; kvwatch's learned {learned_kv_bytes:,} B differs by {gap:+,} B" if gap else ""
    return PinDecision(False, f"{ENABLE_ENV}=1: the engine applies its persisted plan "
                              f"({persisted.kv_cache_memory_bytes:,} B, fingerprint {persisted.fingerprint}){disagree}; "
                              "kvwatch does not pin over it")
