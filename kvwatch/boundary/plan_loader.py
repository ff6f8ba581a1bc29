"""The thin shell around the pure planner: read the model config and environment, then plan."""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from kvwatch.boundary.device_probe import installed_flashinfer, installed_vllm
from kvwatch.boundary.model_source import ModelSource, load_model_source
from kvwatch.errors import ConfigError
from kvwatch.planner.devices import Device, GiB
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import RuleSet
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import resolve


def flags_release(version: VllmVersion | None) -> str:
    """The release whose `vllm serve` parser reads the command (the nearest kvwatch knows)."""
    return str(resolve(version).used)


def cpu_kv_space_bytes(env: Mapping[str, str]) -> int | None:
    raw = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"VLLM_CPU_KVCACHE_SPACE={raw!r}: expected a whole number of GiB") from None
    return value * GiB if value > 0 else None


# The engine environment the plan reads: the profile's switches, the MXFP4 kernel asked for (vllm_releases/moe_kernels.py),
# and (0.34) the runner and removed variables vLLM refuses.
MEMORY_ENV = ("VLLM_USE_V1", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
              "VLLM_USE_V2_MODEL_RUNNER", "VLLM_MARLIN_INPUT_DTYPE", "VLLM_MXFP4_USE_MARLIN")


def plan_command(argv: Sequence[str], device: Device, rules: RuleSet,
                 env: Mapping[str, str] | None = None, non_kv_bytes: int | None = None,
                 vllm_version: VllmVersion | None = None,
                 read_model: Callable[[str], ModelSource] = load_model_source) -> Plan:
    """The plan for an engine command: its model's config.json read (by `read_model`: the watchdog
    reads it once per launch), the environment, then the pure planner (kvwatch.planner.plan.make_plan).
    `vllm_version` None means the installed vLLM's."""
    command = EngineCommand.parse(argv, flags_release(vllm_version or installed_vllm()))
    settings = command.settings()
    source = read_model(settings.model)
    geometry = geometry_from_config(source.config, command.release)
    env = os.environ if env is None else env
    memory = MemoryInputs(cpu_kv_space_bytes=cpu_kv_space_bytes(env),
                          weights_bytes=source.weights_bytes, non_kv_bytes=non_kv_bytes,
                          vllm_version=vllm_version or installed_vllm(),
                          vllm_env=tuple((k, env[k]) for k in MEMORY_ENV if k in env),
                          # FlashInfer's presence only speaks for the vLLM installed here
                          flashinfer_installed=None if vllm_version else installed_flashinfer(),
                          sentence_transformers_pooling=source.sentence_transformers_pooling,
                          lm_head_file_bytes=source.lm_head_file_bytes)
    # vLLM's own override of its max_model_len check (envs.py: "1" or "true").
    allow_long = env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true")
    return make_plan(geometry, settings, device, rules, memory, allow_long_max_model_len=allow_long)
