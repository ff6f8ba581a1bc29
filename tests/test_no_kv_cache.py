"""Encoder-only models (issue 39): vLLM allocates no KV cache for them, and kvwatch plans none.

Every layer of BERT, RoBERTa, XLM-R, ModernBERT, GTE and Nomic is EncoderOnlyAttention, whose KV
cache spec is None (kvwatch/planner/no_kv_cache.py cites the release); the engine gives the KV
cache no memory. The plan says 0 blocks, exactly, and the exporter compares nothing to it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from exporter_support import render, samples, series, value
from fixtures.models.newest import NEWEST

from kvwatch.cli import main
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exporter.actual import ActualKv
from kvwatch.exporter.snapshot import EngineSnapshot, WatchSnapshot
from kvwatch.planner.architecture_kinds import PLANNED, builds_no_cache, verdict
from kvwatch.planner.devices import Device, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.architectures import ARCHITECTURES

BERT = NEWEST["bert_base_uncased"]["config"]
CPU = Device("cpu", "cpu", cpu_fp8_kv=True)
# Every architecture of the table that builds EncoderOnlyAttention only, in its own right.
ENCODER_ONLY = sorted({(release, arch) for release, table in ARCHITECTURES.items() for arch, e in table.items()
                       if e.kinds and set(e.kinds) == {"EncoderOnlyAttention"}
                       and "delegates_to_language_model" not in e.features and "multimodal" not in e.features})


def _plan(config: dict, *flags: str, device: Device = CPU, release: str | None = None) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    memory = MemoryInputs(cpu_kv_space_bytes=1 << 30, vllm_version=parse_version(release) if release else None)
    return make_plan(geometry_from_config(config), settings, device, ruleset_for(release), memory)


def test_the_encoder_only_families_are_all_in_the_table() -> None:
    names = {arch for _release, arch in ENCODER_ONLY}
    for family in ("BertModel", "BertForSequenceClassification", "RobertaModel", "XLMRobertaModel",
                   "XLMRobertaForSequenceClassification", "ModernBertModel", "GteNewModel", "NomicBertModel"):
        assert family in names


@pytest.mark.parametrize("release,arch", ENCODER_ONLY)
def test_every_encoder_only_architecture_is_planned_as_no_kv_cache(release: str, arch: str) -> None:
    assert verdict(arch, release).handling == PLANNED
    plan = _plan({**BERT, "architectures": [arch]}, release=release)
    assert plan.source == "none" and plan.unknown_layer_types == ()
    assert (plan.num_blocks, plan.planned_kv_bytes, plan.kv_cache_tokens, plan.kv_cache_groups) == (0, 0, 0, 0)
    assert arch in plan.no_kv_cache and "EncoderOnlyAttention" in plan.no_kv_cache


def test_bert_base_on_a_gpu_is_exact_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(BERT, device=preset("h100"))
    assert plan.source == "none" and not plan.estimated and plan.gpu_budget is None and plan.warnings == ()
    assert plan.max_model_len == BERT["max_position_embeddings"]
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps(BERT))
    assert main(["plan", "--preset", "h100", "--", "vllm", "serve", str(tmp_path / "bert")]) == 0
    out = capsys.readouterr().out
    assert "KV cache       none, 0 blocks: BertForMaskedLM" in out and "encoder_only_attention.py:94" in out


def test_the_configuration_refusals_still_hold_without_a_kv_cache() -> None:
    plan = _plan(BERT, "--max-model-len", "1024")
    assert plan.num_blocks == 0 and [w.kind for w in plan.warnings] == ["config_refused"]
    assert plan.will_fail


def test_a_decoder_or_a_multimodal_wrapper_still_gets_its_kv_cache() -> None:
    release = max(ARCHITECTURES, key=lambda r: tuple(map(int, r.split("."))))
    assert builds_no_cache(("LlamaForCausalLM",), release) == ""   # EncoderOnlyAttention beside Attention
    wrappers = [a for a, e in ARCHITECTURES[release].items() if set(e.kinds) == {"EncoderOnlyAttention"}
                and ("multimodal" in e.features or "delegates_to_language_model" in e.features)]
    assert wrappers and all(builds_no_cache((a,), release) == "" for a in wrappers)


def test_the_exporter_compares_nothing_to_a_plan_with_no_kv_cache() -> None:
    """vLLM sizes one null block and no tensor for such a model (kv_cache_planning.py:658-662): no
    drift, no estimate error, and plan_info says the plan's source is none."""
    plan = _plan(BERT, device=preset("h100"))
    actual = ActualKv(blocks=1, block_size=16, kv_cache_dtype="auto", bytes_per_block=0, kv_bytes=0,
                      kv_memory_bytes=0, kv_memory_source=None, padding_bytes={})
    engine = EngineSnapshot(EngineStatus("bert", EngineState.READY, plan=plan), up=True, planned=plan, actual=actual)
    found = samples(render(WatchSnapshot(taken_at=1.0, engines=(engine,))))
    assert [s["source"] for s in series(found, "kvwatch_plan_info")] == ["none"]
    assert value(found, "kvwatch_kv_planned_bytes", engine="bert", rank="0") == 0
    assert value(found, "kvwatch_kv_plan_drift_ratio", engine="bert", rank="0") is None
    assert value(found, "kvwatch_kv_plan_estimate_error_ratio", engine="bert", rank="0") is None
