"""The GPU memory budget before launch: kvwatch's KV memory vs what vLLM gave itself, on real GPU logs.

Every successful start-up of tests/fixtures/gpu_logs/corpus.json (public logs: vLLM 0.6-0.19, A100,
H100, RTX 3090, ...): kvwatch's plan for the model's config.json, the flags and a GPU of the
logged total, its KV memory per rank beside the "Available KV cache memory" the engine logged,
and two rules of thumb beside it:
- fixed overhead (kvwatch before issue 16): total x util - weights - (1.5 GiB + 2 % of the card);
- weights + KV x 1.15: KV = (total x util - weights) / 1.15.
Weights come from config.json (the planner's estimate; the logged "Model loading took" is shown).

Run: .venv/bin/python bench/bench_gpu_budget.py
"""
from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvwatch.boundary.plan_loader import plan_command  # noqa: E402
from kvwatch.planner.devices import Device  # noqa: E402
from kvwatch.planner.rules import ruleset_for  # noqa: E402
from kvwatch.planner.weights import weights_bytes  # noqa: E402

GiB = 2**30
CORPUS = ROOT / "tests" / "fixtures" / "gpu_logs" / "corpus.json"
CAPABILITY = {"A100": (8, 0), "H100": (9, 0), "H200": (9, 0), "3090": (8, 6), "4090": (8, 9), "4060": (8, 9),
              "L40S": (8, 9), "6000 Ada": (8, 9)}


def capability(gpu: str) -> tuple[int, int]:
    return next((cc for name, cc in CAPABILITY.items() if name in gpu), (8, 0))


def flags_of(run: dict) -> list[str]:
    out: list[str] = []
    for flag in run["flags"]:
        out += shlex.split(flag)
    keep, i = [], 0
    while i < len(out):   # serving-only flags the planner does not read are dropped
        if out[i] in ("--port", "--host", "--served-model-name"):
            i += 2
            continue
        keep.append(out[i])
        i += 1
    if "--tensor-parallel-size" not in keep and "-tp" not in keep and run.get("tensor_parallel_size", 1) > 1:
        keep += ["--tensor-parallel-size", str(run["tensor_parallel_size"])]
    if "--gpu-memory-utilization" not in keep:
        keep += ["--gpu-memory-utilization", str(run["gpu_memory_utilization"])]
    return keep


def main() -> None:
    runs = [r for r in json.loads(CORPUS.read_text())
            if r.get("status") == "ok" and (r["logged"].get("available_kv_cache_gib") or 0) > 0
            and r["model_config"].get("num_hidden_layers")]
    print(f"{'run':<44}{'logged':>8}{'kvwatch':>9}{'err':>8}{'fixed':>8}{'err':>8}{'x1.15':>8}{'err':>8}"
          f"{'weights logged/est':>20}")
    errors: dict[str, list[float]] = {"kvwatch": [], "fixed": [], "x1.15": []}
    zero_plans = 0
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            cfg = {k: v for k, v in run["model_config"].items() if v is not None}
            model = Path(tmp) / run["name"]
            model.mkdir()
            (model / "config.json").write_text(json.dumps(cfg))
            device = Device("cuda", run["gpu"], capability(run["gpu"]), int(run["total_gpu_memory_gib"] * GiB))
            try:
                plan = plan_command(["vllm", "serve", str(model), *flags_of(run)], device, ruleset_for(None), env={})
            except Exception as exc:   # a config the planner refuses: say so, do not hide the run
                print(f"{run['name']:<44} planner refused: {exc}")
                continue
            logged = run["logged"]["available_kv_cache_gib"]
            ours = plan.kv_memory_bytes / GiB
            tp = run.get("tensor_parallel_size", 1)
            util = run["gpu_memory_utilization"]
            total = run["total_gpu_memory_gib"]
            weights = (run["logged"].get("model_weights_gib") or 0)
            est_weights = (weights_bytes(cfg, 2) or 0) / GiB / tp   # the planner's config.json estimate
            fixed = max(0.0, total * util - est_weights - (1.5 + 0.02 * total))
            rule = max(0.0, (total * util - est_weights) / 1.15)
            zero_plans += ours <= 0
            row = {"kvwatch": ours, "fixed": fixed, "x1.15": rule}
            for key, value in row.items():
                errors[key].append(abs(value - logged) / logged)
            print(f"{run['name']:<44}{logged:>8.2f}{ours:>9.2f}{(ours - logged) / logged:>+8.1%}"
                  f"{fixed:>8.2f}{(fixed - logged) / logged:>+8.1%}{rule:>8.2f}{(rule - logged) / logged:>+8.1%}"
                  f"{weights:>10.2f}/{est_weights:<8.2f} tp{tp}")
    print(f"{len(errors['kvwatch'])} runs; median |error| of the KV memory: "
          + ", ".join(f"{k} {statistics.median(v):.1%}" for k, v in errors.items())
          + f"; plans of zero KV where vLLM started: {zero_plans} (goal: kvwatch <= 3 % median, 0 zero plans)")


if __name__ == "__main__":
    main()
