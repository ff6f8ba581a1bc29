"""kvwatch's plan for a `vllm serve` command, and its checks against vLLM's own answers, shared by the
tests of the packed-group planners (GLM-5-Next, Step5: their oracles' answers by case, live or
recorded) and of the one-spec planners checked against scripts/oracle_sink_spec.py (static sink,
prefix LM)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_sources import oracle_answers, release_tree, unpacked_root

from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

SINK_ORACLE = Path(__file__).resolve().parent.parent / "scripts" / "oracle_sink_spec.py"


def serve_plan(config: dict[str, Any], release: str, model: str, *flags: str, card: str = "h100") -> Plan:
    """kvwatch's plan for `vllm serve <model> <flags>` of a config.json on a release and card."""
    settings = EngineCommand.parse(["vllm", "serve", model, *flags]).settings()
    return make_plan(geometry_from_config(config, release), settings, preset(card), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))


def packed_plan(model: str, case: dict[str, Any], release: str = "0.34.0", card: str = "h100", *flags: str) -> Plan:
    """The plan for a packed oracle's case: its TP, KV budget, max_model_len and half its in-flight tokens
    as --max-num-batched-tokens (two concurrent batches), then `flags`."""
    return serve_plan(case["config"], release, model, "-tp", str(case["tp"]), "--kv-cache-memory-bytes",
                      str(case["kv_memory_bytes"]), "--max-model-len", str(case["max_model_len"]),
                      "--max-num-batched-tokens", str(case["max_in_flight_tokens"] // 2), *flags, card=card)


def packed_oracle(script: Path, cases: dict[str, dict[str, Any]],
                  record: Path) -> Callable[..., dict[str, dict[str, Any]]]:
    """vLLM's answers by case name for a release (0.34.0 unless named), from `script` live where the
    release is unpacked, else from `record`; each release's run once."""
    @cache
    def answers(release: str = "0.34.0") -> dict[str, dict[str, Any]]:
        return oracle_answers(script, release, cases, record)
    return answers


def assert_plan_is_vllms(plan: Plan, want: dict[str, Any]) -> None:
    """The plan has the packed oracle's block size, groups, bytes per block, blocks and tokens, for sure."""
    assert (plan.block_size, plan.kv_cache_groups, plan.bytes_per_block, plan.num_blocks, plan.kv_cache_tokens) == \
        (want["block_size"], len(want["groups"]), want["bytes_per_block"], want["num_blocks"], want["tokens"])
    assert plan.source == "exact" and plan.unknown_layer_types == () and not plan.will_fail


def assert_live_oracle_is_its_record(answers: Callable[..., dict[str, dict[str, Any]]], record: Path,
                                     release: str = "0.34.0") -> None:
    if release_tree(release) is None:
        pytest.skip(f"vLLM {release} is not unpacked (KVWATCH_VLLM_SRC)")
    assert json.loads(record.read_text())[release] == answers(release)


def assert_sizes_are_the_sink_oracles(plan: Plan, truth: dict[str, Any]) -> None:
    """The plan's page, bytes per block, blocks, tokens and a request's memory are scripts/oracle_sink_spec.py's."""
    assert (plan.page_size_bytes, plan.bytes_per_block, plan.num_blocks, plan.kv_cache_tokens) == \
        (truth["page_size_bytes"], truth["bytes_per_block"], truth["num_blocks"], truth["tokens"])
    assert plan.blocks_per_request * plan.page_size_bytes == truth["max_memory_usage_bytes"]


def sink_oracle_answers(cases: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """scripts/oracle_sink_spec.py's answer to each (release, case) by label, run on the unpacked
    releases; the test skips where they are not all here."""
    root = unpacked_root({release for release, _ in cases.values()}, "vllm/v1/kv_cache_interface.py")
    if root is None:
        pytest.skip("the unpacked vLLM 0.33.0/0.34.0 sources are not here (KVWATCH_VLLM_SRC)")
    answers = {}
    for label, (release, case) in cases.items():
        done = subprocess.run([sys.executable, str(SINK_ORACLE), str(root / release)], input=json.dumps(case),
                              capture_output=True, text=True, check=True)
        answers[label] = json.loads(done.stdout)
    return answers
