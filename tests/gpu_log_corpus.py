"""The real GPU start-up logs of tests/fixtures/gpu_logs as planner inputs: each run's config.json,
flags, environment, vLLM version and card, planned as kvwatch plans them. Shared by
tests/test_gpu_budget.py and bench/bench_gpu_budget.py."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.versions import parse_version

GiB = 2**30
CORPUS = Path(__file__).resolve().parent / "fixtures" / "gpu_logs" / "corpus.json"
_CAPABILITY = {"A100": (8, 0), "H100": (9, 0), "H200": (9, 0), "3090": (8, 6), "4090": (8, 9), "4060": (8, 9),
               "L40S": (8, 9), "6000 Ada": (8, 9)}


def all_runs() -> list[dict[str, Any]]:
    return list(json.loads(CORPUS.read_text()))


def started_runs() -> list[dict[str, Any]]:
    """The runs where vLLM started with a KV cache and whose config.json is known."""
    return [r for r in all_runs() if r.get("status") == "ok" and (r["logged"].get("available_kv_cache_gib") or 0) > 0
            and (r["model_config"].get("num_hidden_layers")
                 or (r["model_config"].get("text_config") or {}).get("num_hidden_layers"))]


def capability(gpu: str) -> tuple[int, int]:
    return next((cc for name, cc in _CAPABILITY.items() if name in gpu), (8, 0))


def env_of(run: dict[str, Any]) -> dict[str, str]:
    """Environment the run's flags list as `env NAME=VALUE`."""
    return dict(f.split(None, 1)[1].split("=", 1) for f in run["flags"] if f.startswith("env "))


def flags_of(run: dict[str, Any]) -> list[str]:
    """The run's engine flags (`name=value` of the offline API as `--name value`), serving-only ones dropped."""
    out: list[str] = []
    for flag in run["flags"]:
        if not flag.startswith("env "):
            out += shlex.split(flag if flag.startswith("-") else "--" + flag.replace("_", "-"))
    keep, i = [], 0
    while i < len(out):
        if out[i] in ("--port", "--host", "--served-model-name"):
            i += 2
            continue
        keep.append(out[i])
        i += 1
    if "--tensor-parallel-size" not in keep and "-tp" not in keep and run.get("tensor_parallel_size", 1) > 1:
        keep += ["--tensor-parallel-size", str(run["tensor_parallel_size"])]
    if not any(k.startswith("--gpu-memory-utilization") for k in keep):
        keep += ["--gpu-memory-utilization", str(run["gpu_memory_utilization"])]
    return keep


def model_config(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run["model_config"].items() if v is not None}


def device_of(run: dict[str, Any]) -> Device:
    """The card: the CUDA total the log states, else its name (kvwatch's table of CUDA totals)."""
    gib = run["total_gpu_memory_gib"]
    logged = run["total_gpu_memory_source"].startswith("logged")
    return Device("cuda", run["gpu"], capability(run["gpu"]), int(gib * GiB),
                  cuda_total_bytes=int(gib * GiB) if logged else None)


def plan_run(run: dict[str, Any], model_dir: Path) -> Plan:
    """kvwatch's plan before launch, for the vLLM the run used (`planned_for_vllm_version` where
    its log names no exact version; the corpus says why)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model_config(run)))
    version = parse_version(run.get("planned_for_vllm_version") or run["vllm_version"])
    memory = MemoryInputs(vllm_version=version, vllm_env=tuple(env_of(run).items()))
    command = EngineCommand.parse(["vllm", "serve", str(model_dir), *flags_of(run)])
    geometry = geometry_from_config(model_config(run))
    return make_plan(geometry, command.settings(), device_of(run), ruleset_for(None), memory)


def logged_kv_bytes(run: dict[str, Any]) -> int:
    return int(run["logged"]["available_kv_cache_gib"] * GiB)
