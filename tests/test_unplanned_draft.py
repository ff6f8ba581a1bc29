"""A plan never leaves a draft's cache out silently (issues 38 and 39).

For every --speculative-config whose draft kvwatch does not plan (EAGLE/EAGLE-3/DFlash heads, a draft
model, extract_hidden_states, an MTP head of a family planner/mtp_draft.py does not cover, MTP under
pipeline stages, MTP without num_speculative_tokens, a config that names no method), the plan names the
method and says the draft's KV cache and weights are not counted: a risk only (certain=False, no flag
change, so preflight launches the command as given and the plan is not failing), and its source is
"unknown" with that reason, as for an architecture kvwatch cannot classify (planner/scope.py). Methods
with no draft model (n-gram, suffix) and planned MTP drafts say nothing of the kind.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from fixtures.models.corpus import CORPUS
from test_mtp_draft import ERNIE45, GLM45_AIR, MIMO_7B, QWEN36_27B

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

RELEASE = "0.34.0"
FAMILIES: dict[str, dict[str, Any]] = {
    "deepseek_v3": {**CORPUS["deepseek_v3"]["config"], "num_nextn_predict_layers": 1},   # MTP planned
    "qwen3_next": CORPUS["qwen3_next"]["config"],                                         # MTP planned
    "glm4_moe": GLM45_AIR,                                                                # MTP planned
    "qwen3_5": QWEN36_27B,                                                                # MTP planned
    "mimo": MIMO_7B,                                                                      # MTP planned
    "ernie4_5_moe": ERNIE45,                                                              # MTP planned
    "llama3": CORPUS["llama3"]["config"],                                                 # no MTP head
    "nemotron_h": CORPUS["nemotron_h"]["config"],                                         # MTP not planned
}
PLANNED_MTP = {"deepseek_v3", "qwen3_next", "glm4_moe", "qwen3_5", "mimo", "ernie4_5_moe"}
COMMON = ("--max-model-len", "8192", "--kv-cache-memory-bytes", str(8 << 30))


def _spec(**fields: Any) -> tuple[str, ...]:
    return ("--speculative-config", json.dumps(fields))


# (name, flags, whether the draft is planned for a family whose MTP head kvwatch plans, for any other)
METHODS: list[tuple[str, tuple[str, ...], bool, bool]] = [
    ("none", (), True, True),
    ("ngram", _spec(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4), True, True),
    ("ngram_gpu", _spec(method="ngram_gpu", num_speculative_tokens=3), True, True),
    ("suffix", _spec(method="suffix", num_speculative_tokens=3), True, True),
    ("mtp", _spec(method="mtp", num_speculative_tokens=2), True, False),
    ("family mtp", _spec(method="deepseek_mtp", num_speculative_tokens=1), True, False),
    ("mtp without a count", _spec(method="mtp"), False, False),
    ("mtp under pipeline stages", (*_spec(method="mtp", num_speculative_tokens=1), "-pp", "2"), False, False),
    ("eagle", _spec(method="eagle", model="some/eagle-head", num_speculative_tokens=3), False, False),
    ("eagle3", _spec(method="eagle3", model="some/eagle3-head", num_speculative_tokens=3), False, False),
    ("dflash", _spec(method="dflash", model="some/dflash", num_speculative_tokens=3), False, False),
    ("draft_model", _spec(method="draft_model", model="some/small-model", num_speculative_tokens=4), False, False),
    ("extract_hidden_states", _spec(method="extract_hidden_states", num_speculative_tokens=1), False, False),
    ("no method", _spec(model="some/draft", num_speculative_tokens=3), False, False),
]


def _plan(family: str, flags: tuple[str, ...]) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "some/model", *COMMON, *flags]).settings()
    return make_plan(geometry_from_config(FAMILIES[family], RELEASE), settings, preset("h100"), ruleset_for(RELEASE),
                     MemoryInputs(vllm_version=parse_version(RELEASE)))


def _draft_warnings(plan: Plan) -> list[Any]:
    return [w for w in plan.warnings if "the draft's KV cache and weights are not counted" in w.message]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(("name", "flags", "planned_mtp", "planned_other"), METHODS, ids=[m[0] for m in METHODS])
def test_a_draft_left_out_of_the_plan_is_named(family: str, name: str, flags: tuple[str, ...], planned_mtp: bool,
                                                planned_other: bool) -> None:
    plan = _plan(family, flags)
    left_out = _draft_warnings(plan)
    planned = planned_mtp if family in PLANNED_MTP else planned_other
    if planned:
        assert left_out == []
        assert not any("--speculative-config" in r for r in plan.unknown_layer_types)
        return
    assert len(left_out) == 1
    warning = left_out[0]
    method = json.loads(flags[flags.index("--speculative-config") + 1]).get("method", "(none)")
    assert f"method {method!r}" in warning.message
    assert warning.kind == FailureKind.KV_CACHE_TOO_SMALL
    assert not warning.certain and warning.fix.empty   # a risk: preflight changes nothing for it
    assert plan.source == "unknown" and any(warning.message.startswith(r) for r in plan.unknown_layer_types)
    assert not plan.will_fail


@pytest.mark.parametrize(("flags", "why"), [
    (_spec(method="eagle3", model="h", num_speculative_tokens=3), "EAGLE-3 head"),
    (_spec(method="draft_model", model="m", num_speculative_tokens=3), "separate draft model"),
    (_spec(method="extract_hidden_states", num_speculative_tokens=1), "hidden-state cache"),
    (_spec(method="mtp"), "no num_speculative_tokens"),
    ((*_spec(method="mtp", num_speculative_tokens=1), "-pp", "2"), "last stage"),
    (_spec(model="m", num_speculative_tokens=1), "detects it from the draft checkpoint"),
    (_spec(method="some_custom", num_speculative_tokens=1), "a draft kvwatch does not plan"),
])
def test_the_reason_a_draft_is_left_out(flags: tuple[str, ...], why: str) -> None:
    (warning,) = _draft_warnings(_plan("deepseek_v3", flags))
    assert why in warning.message


def test_an_mtp_head_of_another_family_names_the_families_planned() -> None:
    (warning,) = _draft_warnings(_plan("nemotron_h", _spec(method="mtp", num_speculative_tokens=1)))
    assert "kvwatch plans the MTP heads of DeepSeek-V3, GLM-4.5, Qwen3-Next, Qwen3.5, MiMo, ERNIE 4.5 only" \
        in warning.message


def test_an_unplanned_draft_leaves_the_targets_figures_alone() -> None:
    """The draft is not counted, so the target's figures are those of the plan without it; only the
    mark and the warning differ (and every other warning is a risk, as for an unclassified model)."""
    plain, eagle = _plan("llama3", ()), _plan("llama3", _spec(method="eagle3", model="h", num_speculative_tokens=3))
    assert (eagle.num_blocks, eagle.bytes_per_block, eagle.kv_cache_tokens) == \
        (plain.num_blocks, plain.bytes_per_block, plain.kv_cache_tokens)
    assert plain.source == "exact" and eagle.source == "unknown"
    assert all(not w.certain for w in eagle.warnings)
