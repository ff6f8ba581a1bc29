"""The engine's own memory profile, read from real GPU start-up logs (tests/fixtures/gpu_logs) by the
one parser of start-up lines (kvwatch.diagnosis.startup_lines)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.diagnosis.startup_lines import GiB, LogFacts, parse_fact, parse_facts

LOGS = Path(__file__).parent / "fixtures" / "gpu_logs"
RUNS = [r for r in json.loads((LOGS / "corpus.json").read_text()) if r.get("log_file")]


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_the_profile_read_equals_the_figures_the_log_shows(run: dict) -> None:
    lines = (LOGS / run["log_file"]).read_text().splitlines()
    parts = parse_facts(lines).memory_parts()
    logged = run["logged"]
    for part, key, rounding in (("kv_cache", "available_kv_cache_gib", 0.005),
                                ("weights", "model_weights_gib", 0.005),
                                ("cuda_graphs", "cudagraph_gib", 0.005),
                                ("activation_peak", "activation_peak_gib", 0.005),
                                ("non_torch", "non_torch_gib", 0.005)):
        expected = logged.get(key)
        got = parts.get(part)
        if expected is None or got is None:
            continue
        if expected < 0:     # a failed start: vLLM printed a negative rest of memory
            assert got == 0
            continue
        assert abs(got / GiB - expected) <= rounding, (part, got / GiB, expected)
    assert parts, "every log of the corpus names at least one part"


@pytest.mark.parametrize("line,parts", [
    # V1 (0.10.1.1): three lines, each one part
    ("(EngineCore_0 pid=2881) INFO 09-04 01:29:05 [gpu_model_runner.py:2007] Model loading took 14.2488 GiB "
     "and 2.993822 seconds", {"weights": 14.2488}),
    ("(EngineCore_0 pid=2881) INFO 09-04 01:29:25 [gpu_worker.py:276] Available KV cache memory: 24.83 GiB",
     {"kv_cache": 24.83}),
    ("(EngineCore_0 pid=2881) INFO 09-04 01:29:29 [gpu_model_runner.py:2708] Graph capturing finished in 3 secs, "
     "took 0.50 GiB", {"cuda_graphs": 0.50}),
    # V0 0.6.4: name=value figures on one line (worker/worker.py:232-243)
    ("INFO 11-30 10:00:00 worker.py:232] Memory profiling results: total_gpu_memory=47.54GiB "
     "initial_memory_usage=18.60GiB peak_torch_memory=19.60GiB memory_usage_post_profile=18.62GiB "
     "non_torch_memory=0.44GiB kv_cache_size=22.74GiB gpu_memory_utilization=0.90",
     {"non_torch": 0.44, "kv_cache": 22.74}),
    # V0: the whole profile on one line
    ("INFO 12-22 10:55:34 worker.py:241] model weights take 8.51GiB; non_torch_memory takes 0.26GiB; PyTorch "
     "activation peak memory takes 0.94GiB; the rest of the memory reserved for KV Cache is 2.18GiB.",
     {"weights": 8.51, "non_torch": 0.26, "activation_peak": 0.94, "kv_cache": 2.18}),
    # 0.6.5: one figure a line
    ("INFO 12-13 19:54:18 worker.py:243] PyTorch activation peak memory       1.26GiB", {"activation_peak": 1.26}),
    ("INFO 12-13 19:54:18 worker.py:243] available_kv_cache_memory    53.29GiB", {"kv_cache": 53.29}),
    # 0.7: vLLM's "GB" is 2**30 bytes
    ("INFO 02-11 07:40:45 model_runner.py:1115] Loading model weights took 13.9476 GB", {"weights": 13.9476}),
    # not a part: the serving stats, the refusal's prose, a number that is none
    ("INFO Engine 000: Avg prompt throughput: 0.0 tokens/s, GPU KV cache usage: 4.2%", {}),
    ("ValueError: ... larger than the available KV cache memory (1.0 GiB).", {}),
    ("INFO Available KV cache memory: 1.2.3 GiB", {}),
])
def test_each_format_names_its_parts(line: str, parts: dict[str, float]) -> None:
    got = parse_fact(line, LogFacts()).memory_parts()
    assert {part: round(value / GiB, 4) for part, value in got.items()} == parts
