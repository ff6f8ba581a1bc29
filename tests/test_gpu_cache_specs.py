"""GPU-only cache kinds against vLLM's own spec functions (issue 26).

The sparse-attention indexer of DeepSeek-V3.2 and GLM-5 never runs on the CPU engine (it refuses
sparse attention), so its bytes per token are recorded from vLLM's own `Indexer.k_cache`
spec, built on this CPU from the release's source by tests/record_gpu_cache_specs.py, into
tests/fixtures/models/gpu_cache_specs.json. The planner must equal those bytes, and a GPU plan must
carry them for every layer that builds an indexer.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.models import corpus

from kvwatch.planner.devices import Device, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.indexer import indexer_bytes_per_token_per_layer, indexer_layers
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for

SPECS = json.loads((Path(__file__).parent / "fixtures" / "models" / "gpu_cache_specs.json").read_text())


@pytest.mark.parametrize("name", sorted(SPECS["indexer"]))
def test_indexer_bytes_per_token_equal_vllms_spec(name: str) -> None:
    assert indexer_bytes_per_token_per_layer(corpus.config(name)) == SPECS["indexer"][name]["bytes_per_token_per_layer"]


def test_the_oracle_covers_deepseek_v32_and_glm5() -> None:
    assert {"deepseek_v32", "glm5"} <= set(SPECS["indexer"])


def test_which_layers_build_an_indexer() -> None:
    """deepseek_v2.py: every layer by default; GLM-5's index_topk_freq 4 with offset 3 keeps layers
    0-2 and then every 4th (6, 10, ...)."""
    assert indexer_layers(corpus.config("deepseek_v32")) == 4
    assert indexer_layers(corpus.config("glm5")) == 4          # layers 0, 1, 2, 6 of 8
    glm5_full = {**corpus.config("glm5"), "num_hidden_layers": 78}
    assert indexer_layers(glm5_full) == 3 + len(range(6, 78, 4))
    assert indexer_layers({**glm5_full, "index_topk_pattern": "FS" * 39}) == 39
    assert indexer_layers(corpus.config("deepseek_v3")) == 0


def test_a_gpu_plan_carries_the_indexer_and_a_cpu_plan_refuses() -> None:
    geometry = geometry_from_config(corpus.config("deepseek_v32"))
    settings = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-memory-bytes", "8G"]).settings()
    gpu = make_plan(geometry, settings, preset("h200"), ruleset_for("0.32.0"))
    assert gpu.indexer_bytes_per_token == 4 * SPECS["indexer"]["deepseek_v32"]["bytes_per_token_per_layer"]
    cpu = make_plan(geometry, settings, Device("cpu", "cpu"), ruleset_for("0.32.0"),
                    MemoryInputs(cpu_kv_space_bytes=1 << 30))
    assert cpu.indexer_bytes_per_token == 0 and cpu.will_fail


@pytest.mark.parametrize("key", sorted(SPECS["kda_state"]))
def test_kda_state_bytes_equal_vllms_shape_and_dtype_functions(key: str) -> None:
    """Kimi-Linear's KDA layers: conv state in the model dtype, recurrent state float32 by default;
    a GPU plan's recurrent_state_bytes equals what vLLM's own calculators give, per TP rank."""
    name, tp = key.split(" tp")
    geometry = geometry_from_config(corpus.config(name))
    assert geometry.layout.kinds.count("mamba") == 3 and geometry.attention == "mla"
    settings = EngineCommand.parse(["vllm", "serve", "m", "--tensor-parallel-size", tp,
                                    "--kv-cache-memory-bytes", "8G"]).settings()
    plan = make_plan(geometry, settings, preset("h200"), ruleset_for("0.32.0"))
    assert plan.recurrent_state_bytes == SPECS["kda_state"][key]["bytes_per_layer"]
