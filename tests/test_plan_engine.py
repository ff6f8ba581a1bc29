"""`kvwatch plan` against the real vLLM CPU engine: predicted blocks == the engine's num_gpu_blocks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from engine_support import deepseek_v2_config, engine_env, llama_config, run_engine_to_exit, running_engine, write_model
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.boundary.device_probe import cpu_device
from kvwatch.diagnosis.startup_lines import kv_tokens

pytestmark = pytest.mark.engine

GEOMETRIES = {
    "gqa_1_kv_head": (llama_config(layers=3, kv_heads=1, heads=4, head_dim=64), [], "64"),
    "float32": (llama_config(layers=2, kv_heads=2, head_dim=32, dtype="float32"), ["--dtype", "float32"], "32"),
    "fp8_head_32": (llama_config(layers=2, kv_heads=2, head_dim=32), ["--kv-cache-dtype", "fp8"], "64"),
    "mla_deepseek_v2": (deepseek_v2_config(layers=2), [], "64"),
}


def kvwatch_plan(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "kvwatch.cli", "plan", "--device", "cpu", "--json", "--", *argv],
                         capture_output=True, text=True, env=engine_env(1), timeout=60)
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)


def cache_config_info(metrics_text: str) -> dict[str, str]:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "vllm:cache_config_info":
            return dict(family.samples[0].labels)
    raise AssertionError("vllm:cache_config_info missing from the engine's /metrics")


def logged_kv_tokens(log: str) -> int:
    logged = [tokens for line in log.splitlines() if (tokens := kv_tokens(line)) is not None]
    assert logged, "the engine logged no KV cache size"
    return logged[0]


# Each geometry once, and the explicit block size beside the default once: the flag takes the same path
# for every geometry (the corpus's recorded truths, tests/test_plan_corpus.py, hold the other pairs).
CASES = [("gqa_1_kv_head", "explicit"), ("gqa_1_kv_head", "default"), ("float32", "default"),
         ("fp8_head_32", "explicit"), ("mla_deepseek_v2", "default")]


@pytest.mark.parametrize(("name", "block_flag"), CASES, ids=[f"{n}-{b}" for n, b in CASES])
def test_planned_blocks_equal_engine_blocks(name, block_flag, tmp_path):
    config, flags, block_size = GEOMETRIES[name]
    model = write_model(tmp_path / name, config)
    extra = [*flags, *(["--block-size", block_size] if block_flag == "explicit" else [])]
    plan = kvwatch_plan(["vllm", "serve", str(model), *extra])
    assert not plan["estimated"]

    fp8_refused = "--kv-cache-dtype" in flags and not cpu_device().cpu_fp8_kv
    if fp8_refused:
        # This CPU has no AVX-512/AMX: vLLM sizes the cache, logs it, then refuses the fp8 kernels.
        # kvwatch must predict both: the exact size and the failure.
        assert [w["kind"] for w in plan["warnings"]] == ["kv_dtype_unsupported"]
        rc, log = run_engine_to_exit(model, tmp_path / "engine.log", *extra)
        assert rc != 0 and "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in log
        assert logged_kv_tokens(log) == plan["kv_cache_tokens"]
        assert logged_kv_tokens(log) // plan["block_size"] == plan["num_blocks"]
        assert plan["block_size"] == int(block_size if block_flag == "explicit" else 128)  # CPU_ATTN's default
        return

    assert plan["warnings"] == []
    with running_engine(model, tmp_path / "engine.log", *extra) as engine:
        info = cache_config_info(engine.metrics())
        log = engine.log()
    assert int(info["num_gpu_blocks"]) == plan["num_blocks"]
    assert int(info["block_size"]) == plan["block_size"]
    assert int(info["kv_cache_size_tokens"]) == plan["kv_cache_tokens"]
    assert logged_kv_tokens(log) == plan["kv_cache_tokens"]


def test_pipeline_parallel_plan_is_the_fullest_stage(tmp_path):
    """--pipeline-parallel-size 2 on a 3-layer model: the stages hold 2 and 1 layers, each worker sizes
    1 GiB for its own layers and vLLM takes the smallest number of blocks: the 2-layer stage's.
    The CPU engine binds each worker's threads to a core of its own; it refuses to pick them itself
    on a single NUMA node, so the test gives it the first and last CPUs this process may use."""
    model = write_model(tmp_path / "pp3", llama_config(layers=3, kv_heads=2, head_dim=32))
    flags = ["--pipeline-parallel-size", "2"]
    plan = kvwatch_plan(["vllm", "serve", str(model), *flags])
    assert plan["warnings"] == [] and plan["pipeline_parallel_size"] == 2
    cpus = sorted(os.sched_getaffinity(0))
    with running_engine(model, tmp_path / "engine.log", *flags,
                        env={"VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[-1]}"}) as engine:
        info = cache_config_info(engine.metrics())
        log = engine.log()
    assert int(info["num_gpu_blocks"]) == plan["num_blocks"] == 2**30 // (2 * 128 * 2 * 2 * 32 * 2)
    assert int(info["kv_cache_size_tokens"]) == plan["kv_cache_tokens"] == logged_kv_tokens(log)
