"""HRM-Text's prefix-LM attention (issue 39), against vLLM's own code.

vLLM 0.33/0.34 build one PrefillPrefixLMAttention per stack layer and recurrence step; its spec is
the decoder's FullAttentionSpec with non_causal=True (kvwatch/planner/prefix_lm.py cites the
release). vLLM's answers (scripts/oracle_sink_spec.py, kind "prefix_lm": the release's own spec
class, get_kv_cache_groups, bytes per block and logged token count) are recorded in
tests/fixtures/models/prefix_lm_oracle.json; kvwatch's plan is checked against them, and where the
unpacked releases are present the oracle is run again and must give the recorded answers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.newest import NEWEST
from packed_plan_support import assert_sizes_are_the_sink_oracles, serve_plan, sink_oracle_answers

from kvwatch.errors import ConfigError
from kvwatch.planner.architecture_kinds import PLANNED, verdict
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.layers import FULL
from kvwatch.planner.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "models" / "prefix_lm_oracle.json"
HRM = NEWEST["hrm_text_1b"]["config"]
BUDGET = 40 << 30
CASES = [("0.33.0", 1), ("0.34.0", 1), ("0.34.0", 4)]


def _plan(release: str, tp: int, config: dict[str, Any] = HRM) -> Plan:
    return serve_plan(config, release, "m", "--kv-cache-memory-bytes", str(BUDGET), "-tp", str(tp))


def _case(plan: Plan, tp: int) -> dict[str, Any]:
    return {"kind": "prefix_lm", "layers": 16 * 2 * (3 + 1), "kv_heads": HRM["num_attention_heads"], "tp": tp,
            "head_size": HRM["head_dim"], "block_size": plan.block_size, "max_model_len": plan.max_model_len,
            "budget": BUDGET}


def _label(release: str, tp: int) -> str:
    return f"{release} tp{tp}"


def _recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())["answers"]   # type: ignore[no-any-return]


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_hrm_text_is_planned(release: str) -> None:
    assert verdict("HrmTextForCausalLM", release).handling == PLANNED
    assert verdict("HrmTextForCausalLM", release, HRM).handling == PLANNED


def test_one_cache_layer_per_stack_layer_and_recurrence_step() -> None:
    g = geometry_from_config(HRM, "0.34.0")
    assert (g.num_layers, g.num_kv_heads, g.head_size, g.head_size_v) == (128, 12, 128, 128)
    assert set(g.layer_kinds) == {FULL} and len(g.layer_kinds) == 128
    # the weights are the two stacks' 32 layers, run at every step: about 1.1 B parameters, not 4x that
    assert g.weight_count is not None and g.weight_count.num_layers == 32
    assert 1.0e9 < g.weight_count.linear_params + g.weight_count.embedding_params < 1.2e9
    # vLLM counts the layers from the stacks, not num_hidden_layers, and its heads from the
    # attention heads (MHA), not num_key_value_heads
    odd = geometry_from_config({**HRM, "num_hidden_layers": 16, "num_key_value_heads": 4}, "0.34.0")
    assert (odd.num_layers, odd.num_kv_heads) == (128, 12)
    with pytest.raises(ConfigError, match="num_layers_per_stack"):
        geometry_from_config({k: v for k, v in HRM.items() if k != "num_layers_per_stack"}, "0.34.0")


@pytest.mark.parametrize("release,tp", CASES, ids=[_label(*c) for c in CASES])
def test_kvwatch_plans_what_vllms_spec_and_grouping_give(release: str, tp: int) -> None:
    plan = _plan(release, tp)
    truth = _recorded()[_label(release, tp)]
    assert plan.source == "exact" and plan.unknown_layer_types == ()
    assert (truth["spec"], truth["kind"], truth["non_causal"]) == ("FullAttentionSpec", "full_attention", True)
    assert len(truth["groups"]) == plan.kv_cache_groups == 1 and len(truth["groups"][0]["layers"]) == 128
    assert_sizes_are_the_sink_oracles(plan, truth)


def test_the_recorded_answers_are_the_releases_own() -> None:
    assert sink_oracle_answers({_label(*c): (c[0], _case(_plan(*c), c[1])) for c in CASES}) == _recorded()


@pytest.mark.parametrize("fields", [{"num_layers_per_stack": 10**9}, {"H_cycles": 10**9}, {"L_cycles": True},
                                    {"num_layers_per_stack": 4096, "H_cycles": 4096, "L_cycles": 4096}],
                         ids=["stack", "cycles", "bool", "product"])
def test_a_malformed_stack_is_one_config_error_not_a_memory_error(fields: dict[str, Any]) -> None:
    """num_layers_per_stack of 10**9 built a list of billions of layer kinds: a MemoryError traceback."""
    with pytest.raises(ConfigError, match="config.json: .*(num_layers_per_stack|H_cycles|L_cycles)"):
        geometry_from_config({**HRM, **fields}, "0.34.0")
