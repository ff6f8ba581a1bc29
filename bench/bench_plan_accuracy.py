"""Plan accuracy on the real vLLM CPU engine: kvwatch's plan vs a fudge-factor sizing rule.

For every geometry the tests run (tests/test_plan_engine.py), with an explicit block size and with the
engine's default: the blocks vLLM allocated (vllm:cache_config_info, or its logged KV size when this CPU
refuses fp8), kvwatch's planned blocks, and the estimate of the rule small sizing tools use
(KV bytes/token = 2 x layers x kv_heads x hidden/heads x dtype bytes; memory = weights + KV x 1.15).

Run: .venv/bin/python bench/bench_plan_accuracy.py     (starts 8 engines: ~10 minutes on 2 cores)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from engine_support import run_engine_to_exit, running_engine, write_model  # noqa: E402
from test_plan_engine import GEOMETRIES, cache_config_info, kvwatch_plan, logged_kv_tokens  # noqa: E402

GiB = 2**30


def fudge_blocks(config: dict, flags: list[str], block_size: int, kv_memory: int) -> int:
    """What a weights + KV x 1.15 sizing rule predicts for this KV memory."""
    heads = config["num_attention_heads"]
    head_dim = config["hidden_size"] // heads
    dtype_bytes = 4 if "float32" in flags else 1 if "fp8" in flags else 2
    per_token = 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim * dtype_bytes
    return int(kv_memory / (per_token * 1.15)) // block_size


def engine_blocks(model: Path, extra: list[str], log_path: Path) -> int:
    with running_engine(model, log_path, *extra) as engine:
        return int(cache_config_info(engine.metrics())["num_gpu_blocks"])


def main() -> None:
    print(f"{'geometry':<18}{'block':<10}{'engine':>9}{'kvwatch':>9}{'|diff|':>8}{'fudge':>9}{'|diff|':>8}")
    worst_kvwatch = worst_fudge = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config, flags, block) in GEOMETRIES.items():
            for mode in ("explicit", "default"):
                model = write_model(Path(tmp) / f"{name}-{mode}", config)
                extra = [*flags, *(["--block-size", block] if mode == "explicit" else [])]
                plan = kvwatch_plan(["vllm", "serve", str(model), *extra])
                log_path = Path(tmp) / f"{name}-{mode}.log"
                if any(w["kind"] == "kv_dtype_unsupported" for w in plan["warnings"]):
                    _, log = run_engine_to_exit(model, log_path, *extra)
                    actual = logged_kv_tokens(log) // plan["block_size"]
                else:
                    actual = engine_blocks(model, extra, log_path)
                fudge = fudge_blocks(config, flags, plan["block_size"], GiB)
                d_k, d_f = abs(plan["num_blocks"] - actual), abs(fudge - actual)
                worst_kvwatch, worst_fudge = max(worst_kvwatch, d_k), max(worst_fudge, d_f)
                print(f"{name:<18}{mode + ' ' + str(plan['block_size']):<10}{actual:>9}{plan['num_blocks']:>9}"
                      f"{d_k:>8}{fudge:>9}{d_f:>8}", flush=True)
    print(f"worst |planned - actual| blocks: kvwatch {worst_kvwatch}, fudge rule {worst_fudge} "
          f"(bar: kvwatch 0 on every fixed-KV-memory case)")


if __name__ == "__main__":
    main()
