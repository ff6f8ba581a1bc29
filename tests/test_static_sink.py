"""openPangu's attention with static sink tokens (issue 39), against vLLM's own code.

vLLM 0.33/0.34 build StaticSinkAttention layers for openPangu configs with param_sink_number > 0 and
no MLA fields; their spec is SinkFullAttentionSpec (kvwatch/planner/static_sink.py cites the
release). vLLM's answers (scripts/oracle_sink_spec.py: the release's own SinkFullAttentionSpec,
SinkFullAttentionManager, get_kv_cache_groups, bytes per block and logged token count, run on this
CPU) are recorded in tests/fixtures/models/sink_oracle.json; kvwatch's plan is checked against them,
and where the unpacked releases are present (KVWATCH_VLLM_SRC) the oracle is
run again and must give the recorded answers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.newest import NEWEST
from packed_plan_support import assert_sizes_are_the_sink_oracles, serve_plan, sink_oracle_answers

from kvwatch.planner.architecture_kinds import PLANNED, verdict
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.layers import FULL
from kvwatch.planner.plan import Plan
from kvwatch.vllm_releases.architectures import ARCHITECTURES

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "models" / "sink_oracle.json"
PANGU = NEWEST["openpangu_pro_moe_v2_registry"]["config"]
BUDGET = 40 << 30
# (release, tensor-parallel size, --block-size or None): the block size vLLM is given is kvwatch's
CASES = [("0.33.0", 1, None), ("0.34.0", 1, None), ("0.34.0", 2, None), ("0.34.0", 1, 48)]
SINK_ARCHITECTURES = sorted({(r, a) for r, table in ARCHITECTURES.items() for a, e in table.items()
                             if "StaticSinkAttention" in e.kinds})


def _plan(release: str, tp: int, block: int | None, config: dict[str, Any] = PANGU) -> Plan:
    flags = ["--kv-cache-memory-bytes", str(BUDGET), "-tp", str(tp)] + (["--block-size", str(block)] if block else [])
    return serve_plan(config, release, "m", *flags)


def _case(plan: Plan, tp: int) -> dict[str, Any]:
    return {"layers": PANGU["num_hidden_layers"], "kv_heads": PANGU["num_key_value_heads"], "tp": tp,
            "qk_rope_dim": PANGU["qk_rope_dim"], "qk_nope_dim": PANGU["qk_nope_dim"],
            "v_channels": PANGU["v_channels"], "sink_len": PANGU["param_sink_number"],
            "block_size": plan.block_size, "max_model_len": plan.max_model_len, "budget": BUDGET}


def _label(release: str, tp: int, block: int | None) -> str:
    return f"{release} tp{tp} block {block or 'default'}"


def _recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())["answers"]   # type: ignore[no-any-return]


@pytest.mark.parametrize("release,arch", SINK_ARCHITECTURES)
def test_every_architecture_building_sink_layers_is_planned(release: str, arch: str) -> None:
    assert verdict(arch, release).handling == PLANNED
    assert verdict(arch, release, PANGU).handling == PLANNED


def test_the_sink_layers_are_full_attention_with_k_and_v_heads_of_their_own() -> None:
    g = geometry_from_config(PANGU, "0.34.0")
    assert (g.attention, g.num_kv_heads, g.head_size, g.head_size_v, g.sink_len) == ("full", 4, 192, 128, 128)
    # interleaved_sliding_window sets the layer's window, which SinkFullAttentionSpec drops
    windowed = geometry_from_config({**PANGU, "interleaved_sliding_window": 4096, "sliding_window": 4096}, "0.34.0")
    assert windowed.layer_kinds == (FULL, FULL) and windowed.sliding_window is None


def test_mla_fields_win_over_the_sinks() -> None:
    mla = {**PANGU, "architectures": ["PanguUltraMoEForCausalLM"], "model_type": "pangu_ultra_moe",
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512}
    g = geometry_from_config(mla, "0.34.0")
    assert (g.attention, g.sink_len) == ("mla", 0)


@pytest.mark.parametrize("release,tp,block", CASES, ids=[_label(*c) for c in CASES])
def test_kvwatch_plans_what_vllms_spec_and_grouping_give(release: str, tp: int, block: int | None) -> None:
    plan = _plan(release, tp, block)
    truth = _recorded()[_label(release, tp, block)]
    refused = [w.message for w in plan.warnings if "static sink tokens" in w.message]
    if "error" in truth:   # vLLM's SinkFullAttentionManager refuses the block size
        assert truth == {"error": "AssertionError"} and refused
        return
    assert not refused and plan.source == "exact" and plan.backend == "FLASH_ATTN"
    assert truth["spec"] == "SinkFullAttentionSpec" and truth["kind"] == "sink_full_attention"
    assert len(truth["groups"]) == plan.kv_cache_groups == 1
    assert truth["groups"][0]["layers"] == list(range(PANGU["num_hidden_layers"]))
    assert_sizes_are_the_sink_oracles(plan, truth)


def test_the_recorded_answers_are_the_releases_own() -> None:
    assert sink_oracle_answers({_label(*c): (c[0], _case(_plan(*c), c[1])) for c in CASES}) == _recorded()


def test_kv_heads_split_over_tp_never_replicate() -> None:
    refused = [w for w in _plan("0.34.0", 8, None).warnings if "KV heads replication" in w.message]
    assert len(refused) == 1 and refused[0].certain and refused[0].fix.empty
    odd = {**PANGU, "num_key_value_heads": 6, "num_attention_heads": 12}
    assert any("not divisible by tp_size 4" in w.message for w in _plan("0.34.0", 4, None, odd).warnings)
