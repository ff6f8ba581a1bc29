"""Before the first launch: plan the command, and apply the fixes for failures that are certain.

A known-bad plan (an illegal block size, a kernel limit, a KV cache too small for the
max model len) never starts. A model kvwatch cannot classify (plan source "unknown") is launched
as given: no rule is known to hold for it (kvwatch/planner/scope.py). Fixes are applied one plan at a time, re-planning after
each, because one fix changes what the next should be (fp8 -> auto doubles the bytes
per token, so the largest max model len halves). The policy's allow_* switches are
honoured. Planning errors never stop kvwatch: the engine is then launched as given.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

from kvwatch.boundary import device_probe
from kvwatch.boundary.model_source import ModelSource, load_model_source
from kvwatch.boundary.plan_loader import plan_command
from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.gpu_budget import profile_key
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import RuleSet
from kvwatch.policy import Policy
from kvwatch.values.versions import parse_version
from kvwatch.watchdog.memory_learning import pin_costs_extensible
from kvwatch.watchdog.records import PreflightFix

_LOG = logging.getLogger(__name__)

# Which policy switch allows kvwatch to change which flag.
POLICY_FLAGS = {
    "--kv-cache-dtype": "allow_kv_dtype_change",
    "--block-size": "allow_block_size_change",
    "--max-model-len": "allow_max_model_len_change",
    "--gpu-memory-utilization": "allow_gpu_memory_utilization_change",
    "--max-num-batched-tokens": "allow_max_num_batched_tokens_change",
}
MAX_ROUNDS = 6


def device_for_spec(spec: str = "") -> Device:
    """The device to plan for from the config's `device` string (`--device`): "cpu", "gpu" or a GPU
    index, or "" for kvwatch.boundary.device_probe.choose_device's own rule (the one chooser)."""
    if spec.isdigit():
        return device_probe.choose_device(index=int(spec))
    return device_probe.choose_device("cpu" if spec == "cpu" else "gpu" if spec == "gpu" else None)


def learned_key(command: EngineCommand, device: Device) -> str | None:
    """The key of the learned non-KV memory that holds for this command on this card and vLLM."""
    try:
        return profile_key(command.settings(), device, device_probe.installed_vllm())
    except KvwatchError:
        return None


def plan_with_learned(command: EngineCommand, device: Device, rules: RuleSet, env: Mapping[str, str],
                      learned: Mapping[str, int] | None = None,
                      read_model: Callable[[str], ModelSource] = load_model_source) -> Plan | None:
    """The plan of the watchdog's layer: kvwatch.boundary.plan_loader.plan_command's, refined by the
    non-KV memory an earlier launch of the same profile measured; None (logged) where it cannot plan."""
    key = learned_key(command, device) if learned else None
    try:
        return plan_command(command.argv, device, rules, env=env,
                            non_kv_bytes=learned.get(key) if learned and key else None, read_model=read_model)
    except KvwatchError as exc:
        _LOG.info("plan: not available: %s", exc)
        return None


def allowed(flag: str, policy: Policy) -> bool:
    switch = POLICY_FLAGS.get(flag)
    return flag not in policy.fixed_flags and (switch is None or bool(getattr(policy, switch)))


def preflight(command: EngineCommand, device: Device, rules: RuleSet, env: Mapping[str, str], policy: Policy,
              learned: Mapping[str, int] | None = None,
              read_model: Callable[[str], ModelSource] = load_model_source,
              ) -> tuple[EngineCommand, list[PreflightFix], Plan | None]:
    """The command with the certain fixes applied, what was changed, and the final plan."""
    fixes: list[PreflightFix] = []
    plan = plan_with_learned(command, device, rules, env, learned, read_model)
    if plan is not None and plan.unknown_layer_types:
        # planner/scope.py: no rule is known to hold for this model, so none changes its command
        _LOG.warning("preflight: launching the command as given: kvwatch cannot classify %s",
                     "; ".join(plan.unknown_layer_types))
    for _ in range(MAX_ROUNDS):
        if plan is None or plan.unknown_layer_types:
            break
        warning = next((w for w in plan.warnings
                        if w.certain and not w.fix.empty and all(allowed(f, policy) for f in w.fix.flags)), None)
        if warning is None:
            break
        fixed = warning.fix.apply(command)
        if fixed.argv == command.argv:
            break
        _LOG.info("preflight: %s: %s; changed %s", warning.kind, warning.message, warning.fix.describe())
        fixes.append(PreflightFix(warning.kind, warning.message, warning.fix))
        command = fixed
        plan = plan_with_learned(command, device, rules, env, learned, read_model)
    if plan is not None:
        for w in plan.warnings:
            level = "will fail, no allowed fix" if w.certain else "risk"
            _LOG.warning("preflight: %s: [%s] %s", level, w.kind, w.message)
    return command, fixes, plan


# What an explicit utilization leaves beyond the other processes' memory when kvwatch sets one beside
# them: the diagnosis' fit margin (diagnosis/remedies.py _FIT_MARGIN_BYTES).
BESIDE_OTHERS_MARGIN_BYTES = 1 << 30


def utilization_beside_others(command: EngineCommand, device: Device, foreign_bytes: int,
                              policy: Policy) -> FlagChange | None:
    """Where vLLM's extensible KV cache is on (0.34+, CUDA) with --gpu-memory-utilization unset, the
    cache takes what is free after warm-up, with no room kept for other processes on the GPU (vLLM
    0.34.0, vllm/config/cache.py:226-234; the start-up check is skipped, vllm/v1/worker/utils.py:
    782-798). With other processes holding `foreign_bytes` (kvwatch measures them), the utilization
    that leaves them that memory and a margin; None where it does not apply or the policy forbids it."""
    settings = command.settings()
    if (foreign_bytes <= 0 or device.platform != "cuda" or not device.total_memory_bytes
            or settings.gpu_memory_utilization_given or not allowed("--gpu-memory-utilization", policy)):
        return None
    if not pin_costs_extensible(settings, device.platform, parse_version(command.release)):
        return None
    total = device.total_memory_bytes
    value = math.floor((total - foreign_bytes - BESIDE_OTHERS_MARGIN_BYTES) / total * 100) / 100
    if value < policy.min_gpu_memory_utilization:
        return None
    return FlagChange({"--gpu-memory-utilization": value})
