"""The GPU memory budget before launch: kvwatch's KV memory vs what vLLM gave itself, on real GPU logs.

Every successful start-up of tests/fixtures/gpu_logs/corpus.json (public logs: vLLM 0.6-0.19, A100,
H100, RTX 3090, ...): kvwatch's plan for the model's config.json, the flags, the environment and
the vLLM version of the run (`planned_for_vllm_version` where the log names none exactly, with its
reason in the corpus), on a GPU of the logged CUDA total (else the card's name), its KV memory per
rank beside the "Available KV cache memory" the engine logged, and two rules of thumb beside it:
- fixed overhead (kvwatch before issue 16): total x util - weights - (1.5 GiB + 2 % of the card);
- weights + KV x 1.15: KV = (total x util - weights) / 1.15.
Weights come from config.json (the planner's estimate; the logged "Model loading took" is shown).

Run: .venv/bin/python bench/bench_gpu_budget.py
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tests"))

from gpu_log_corpus import plan_run, started_runs  # noqa: E402

from kvwatch.planner.weights import weights_bytes  # noqa: E402

GiB = 2**30


def main() -> None:
    runs = started_runs()
    print(f"{'run':<44}{'logged':>8}{'kvwatch':>9}{'err':>8}{'fixed':>8}{'err':>8}{'x1.15':>8}{'err':>8}"
          f"{'weights logged/est':>20}")
    errors: dict[str, list[float]] = {"kvwatch": [], "fixed": [], "x1.15": []}
    zero_plans = 0
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            cfg = {k: v for k, v in run["model_config"].items() if v is not None}
            try:
                plan = plan_run(run, Path(tmp) / run["name"])
            except Exception as exc:   # a config the planner refuses: say so, do not hide the run
                print(f"{run['name']:<44} planner refused: {exc}")
                continue
            budget = plan.gpu_budget
            assert budget is not None
            version = budget.version
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
                  f"{weights:>10.2f}/{est_weights:<8.2f} tp{tp} v{version}")
            if "-v" in sys.argv[1:]:
                print("    " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in budget.parts().items())
                      + f"; total {budget.cuda_total_bytes / GiB:.2f} x {budget.utilization}; "
                      f"{budget.max_num_batched_tokens} tokens, {budget.max_num_seqs} seqs; {budget.release}")
    print(f"{len(errors['kvwatch'])} runs; median |error| of the KV memory: "
          + ", ".join(f"{k} {statistics.median(v):.1%}" for k, v in errors.items())
          + f"; plans of zero KV where vLLM started: {zero_plans} (goal: kvwatch <= 3 % median, 0 zero plans)")


if __name__ == "__main__":
    main()
