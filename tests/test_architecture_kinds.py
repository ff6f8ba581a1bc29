"""Every architecture vLLM registers is planned, refused or marked unknown: never a silent default.

The table (kvwatch/vllm_releases/architectures.py) is generated from each release's source by
scripts/gen_vllm_architectures.py; these tests hold kvwatch's handling of it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.models import corpus
from fixtures.models.corpus_beyond import BEYOND

from kvwatch.boundary.plan_loader import plan_command
from kvwatch.cli import main
from kvwatch.planner.architecture_kinds import (
    DRAFT,
    GATED_KINDS,
    LANGUAGE_MODELS,
    PLANNED,
    PLANNED_KINDS,
    REFUSED,
    UNKNOWN,
    builds_no_cache,
    delegates,
    table_release,
    unknown_reasons,
    verdict,
)
from kvwatch.planner.architectures import IN_TRANSFORMERS, PREVIOUSLY_SUPPORTED, refusals
from kvwatch.planner.config_defaults import HEAD_DIM_DEFAULTS
from kvwatch.planner.cross_attention import cross_attention_planned
from kvwatch.planner.devices import cpu_device_from_flags
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import MLA_MODEL_TYPES, geometry_from_config
from kvwatch.planner.layers import PURE_STATE_SPACE
from kvwatch.planner.plan import architecture_unknowns
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.architecture_details import DETAILS
from kvwatch.vllm_releases.architectures import ARCHITECTURES

CPU = cpu_device_from_flags({"avx512f"}, "a CPU")
ALL = [(release, arch) for release, table in sorted(ARCHITECTURES.items()) for arch in sorted(table)]


def _llama_like(architecture: str, model_type: str = "llama", **extra: object) -> dict:
    config = {"architectures": [architecture], "model_type": model_type, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512, "intermediate_size": 1024,
              "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    config.update(extra)
    return config


def _plan(config: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    rc = main(["plan", "--device", "cpu", *flags, "--", "vllm", "serve", str(tmp_path / "m"),
               "--max-model-len", "2048"])
    return rc, capsys.readouterr().out


def test_the_table_covers_the_installed_release_with_a_source_per_entry() -> None:
    assert "0.32.0" in ARCHITECTURES
    table = ARCHITECTURES["0.32.0"]
    assert len(table) > 400
    for arch in ("LlamaForCausalLM", "Gemma4ForCausalLM", "Qwen3NextForCausalLM", "MambaForCausalLM",
                 "Lfm2ForCausalLM", "DeepseekV32ForCausalLM", "KimiLinearForCausalLM", "BertModel"):
        assert table[arch].source.startswith("vllm/") and table[arch].source.endswith(".py")
    # kinds read from the source, not written by hand
    assert table["MambaForCausalLM"].kinds == ("MAMBA1",)
    assert "SHORT_CONV" in table["Lfm2ForCausalLM"].kinds
    assert "GDN_ATTN" in table["Qwen3NextForCausalLM"].kinds
    assert "DeepseekV32IndexerCache" in table["DeepseekV32ForCausalLM"].kinds
    assert "kv_sharing" in table["Gemma4ForCausalLM"].features
    assert table["BertModel"].kinds == ("EncoderOnlyAttention",)
    details = DETAILS["0.32.0"]
    assert "GDN_ATTN:kda_state_dtype" in details["KimiLinearForCausalLM"]["state_dtypes"]
    # the config-class defaults vLLM relies on, as data
    assert details["Qwen3NextForCausalLM"]["config_defaults"]["head_dim"] == 256
    assert details["Gemma3nForConditionalGeneration"]["config_defaults"]["num_kv_shared_layers"] == 15
    assert set(DETAILS) == set(ARCHITECTURES) and all(set(DETAILS[r]) <= set(ARCHITECTURES[r]) for r in DETAILS)


@pytest.mark.parametrize(("release", "arch"), ALL)
def test_every_registered_architecture_gets_one_of_four_verdicts(release: str, arch: str) -> None:
    entry = ARCHITECTURES[release][arch]
    v = verdict(arch, release, in_transformers=IN_TRANSFORMERS)
    assert v.handling in (PLANNED, REFUSED, UNKNOWN, DRAFT)
    if v.handling == PLANNED:
        assert v.reason == ""
        assert all(k in PLANNED_KINDS or k in GATED_KINDS or cross_attention_planned(k, arch) for k in entry.kinds)
    elif v.handling == DRAFT:   # a draft head planned with its target: a speculative-decoding entry of planned kinds
        assert entry.group == "speculative_decoding" and "planned with its target" in v.reason
        assert entry.kinds and all(k in PLANNED_KINDS for k in entry.kinds)
    elif v.handling == REFUSED:
        assert entry.group == "previously_supported" and arch not in IN_TRANSFORMERS
    else:   # unknown: the reason names what kvwatch cannot classify
        assert v.unclassified and all(k in v.reason for k in v.unclassified)


@pytest.mark.parametrize("arch", sorted(a for a in PREVIOUSLY_SUPPORTED if a not in IN_TRANSFORMERS))
def test_a_refused_verdict_is_a_refusal_the_plan_predicts(arch: str) -> None:
    geometry = geometry_from_config(_llama_like(arch))
    found = refusals(geometry, EngineCommand.parse(["vllm", "serve", "m"]).settings(), CPU)
    assert found and f"Model architecture {arch} was supported in vLLM until" in found[0].message


def test_every_corpus_architecture_is_planned() -> None:
    """The architectures kvwatch equals the engine on stay planned, not marked unknown."""
    configs = [c["config"] for c in corpus.CORPUS.values()] + [c["config"] for c in BEYOND.values()]
    archs = {a for c in configs for a in c.get("architectures", [])}
    for arch in sorted(archs):
        expected = REFUSED if arch in PREVIOUSLY_SUPPORTED and arch not in IN_TRANSFORMERS else PLANNED
        assert verdict(arch, "0.32.0", in_transformers=IN_TRANSFORMERS).handling == expected, arch


def test_an_architecture_the_release_does_not_register_is_marked_unknown(tmp_path: Path, capsys) -> None:
    """Attention-only in every field kvwatch reads, but no vLLM release serves it: the plan is made,
    exit 0, and says plainly that the architecture is unknown (before the table: planned silently)."""
    rc, out = _plan(_llama_like("NeverSeenForCausalLM", "never_seen"), tmp_path, capsys, "--vllm-version", "0.32.0")
    assert rc == 0
    assert ("UNKNOWN: kvwatch cannot classify: architecture NeverSeenForCausalLM, which vLLM 0.32.0 does not "
            "register") in out
    plan = plan_command(["vllm", "serve", str(tmp_path / "m")], CPU, ruleset_for(None),
                        env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert plan.source == "unknown"


def test_a_registered_attention_only_architecture_is_planned_without_a_mark(tmp_path: Path, capsys) -> None:
    rc, out = _plan(_llama_like("LlamaForCausalLM"), tmp_path, capsys, "--vllm-version", "0.32.0")
    assert rc == 0 and "UNKNOWN" not in out and "OK: vLLM should accept this plan" in out


def test_an_architecture_building_a_kind_kvwatch_cannot_classify_names_it(tmp_path: Path, capsys) -> None:
    # any architecture of its own (not a wrapper, not a hybrid) still building a kind with no rule
    arch, kind = next((a, v.unclassified[0]) for a, e in sorted(ARCHITECTURES["0.32.0"].items())
                      if not delegates(e) and not {"hybrid", "class_not_found"} & set(e.features)
                      and (v := verdict(a, "0.32.0")).unclassified)
    rc, out = _plan(_llama_like(arch, "llama"), tmp_path, capsys, "--vllm-version", "0.32.0")
    assert rc == 0
    assert "UNKNOWN: kvwatch cannot classify:" in out and kind in out


def test_a_gated_kind_counts_only_when_config_json_selects_it() -> None:
    """DeepSeek's RSWAAttention is built only when config.json has rswa_window (deepseek_v2.py:209)."""
    assert verdict("DeepseekV3ForCausalLM", "0.32.0", {}).handling == PLANNED
    v = verdict("DeepseekV3ForCausalLM", "0.32.0", {"rswa_window": 128})
    assert v.handling == UNKNOWN and v.unclassified == ("RSWAAttention",)


def test_state_layers_an_architecture_never_builds_are_marked_unknown(tmp_path: Path, capsys) -> None:
    """config.json lists Mamba layers, but vLLM's Llama builds attention only: kvwatch's hybrid plan
    would be a guess, so it says so."""
    config = _llama_like("LlamaForCausalLM", layer_types=["mamba", "full_attention"] * 2, mamba_d_state=16,
                         mamba_n_heads=8, mamba_d_head=64)
    rc, out = _plan(config, tmp_path, capsys, "--vllm-version", "0.32.0")
    assert rc == 0 and "builds none" in out


def test_the_table_release_follows_the_minor_release() -> None:
    assert table_release("0.32.1") == "0.32.0"
    assert table_release(None) == max(ARCHITECTURES, key=lambda r: tuple(map(int, r.split("."))))
    assert table_release("0.9.2") is None


def test_an_encoder_only_model_is_planned_as_no_kv_cache_not_with_blocks_vllm_never_allocates() -> None:
    v = verdict("BertModel", "0.32.0")
    assert v.handling == PLANNED and v.unclassified == ()
    assert "hold no KV cache" in builds_no_cache(("BertModel",), "0.32.0")   # tests/test_no_kv_cache.py


def test_the_corpus_configs_get_no_architecture_mark_but_where_a_release_changed_the_spec() -> None:
    """Every corpus config, planned as 0.32 (where kvwatch equals the engine on all of them) and as
    0.33: no mark. 0.33's QwenGatedDeltaNetAttention redefines get_kv_cache_spec (prefill checkpoint
    blocks), which kvwatch plans (vllm_releases/gdn_checkpoint.py), so Qwen3-Next is planned too."""
    marked = {}
    for name, case in corpus.CORPUS.items():
        geometry = geometry_from_config(case["config"])
        for release in ("0.32.0", "0.33.0"):
            if found := architecture_unknowns(geometry, parse_version(release)):
                marked[(name, release)] = found
    assert marked == {}


def test_vllm_serves_the_first_listed_architecture_it_registers() -> None:
    """registry.py inspect_model_cls: an unregistered name before a registered one is passed over."""
    assert unknown_reasons(("NeverSeenForCausalLM", "LlamaForCausalLM"), {}, False, "0.32.0") == ()
    assert "NeverSeenForCausalLM" in unknown_reasons(("NeverSeenForCausalLM",), {}, False, "0.32.0")[0]


def test_the_head_dim_defaults_kvwatch_keeps_are_those_of_the_config_classes_vllm_reads() -> None:
    """kvwatch/planner/config_defaults.py against the table: for every planned attention architecture
    whose classes read head_dim, the default transformers' config class gives it (when config.json has
    none) is the one kvwatch plans with. MLA models (head_dim unused) and multimodal wrappers (their
    text model is checked under its own name) are left out."""
    disagree = {}
    for arch, entry in ARCHITECTURES["0.32.0"].items():
        details = DETAILS["0.32.0"].get(arch, {})
        default = details.get("config_defaults", {}).get("head_dim")
        if default is None or verdict(arch, "0.32.0").handling != PLANNED or delegates(entry):
            continue
        for model_type in details.get("model_types", ()):
            # a composite beside its text config (llama4, llama4_text): kvwatch reads the text config
            if model_type in MLA_MODEL_TYPES or model_type in PURE_STATE_SPACE \
                    or f"{model_type}_text" in details["model_types"]:
                continue
            if HEAD_DIM_DEFAULTS.get(model_type) != default:
                disagree[model_type] = (default, HEAD_DIM_DEFAULTS.get(model_type))
    assert disagree == {}


def _qwen3_5_text(**extra: object) -> dict:
    """Qwen3.5's text model as transformers' Qwen3_5TextConfig defaults it, shrunk to 8 layers."""
    return _llama_like("Qwen3_5ForCausalLM", "qwen3_5_text", num_hidden_layers=8, num_attention_heads=16,
                       num_key_value_heads=4, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, **extra)


def test_qwen3_5_without_layer_types_takes_the_config_class_interval() -> None:
    """transformers' Qwen3_5TextConfig: no layer_types means every 4th layer full, the rest gated
    delta nets (configuration_qwen3_5.py __post_init__); kvwatch planned all 8 as full attention."""
    geometry = geometry_from_config(_qwen3_5_text())
    assert geometry.layer_kinds == ("mamba", "mamba", "mamba", "full") * 2
    assert geometry.layout.state is not None and geometry.layout.state.family == "gated_delta_net"
    assert architecture_unknowns(geometry, parse_version("0.32.0")) == ()


def test_a_hybrid_class_without_state_layers_or_a_layer_list_is_marked_unknown() -> None:
    """vLLM builds the architecture as a hybrid (IsHybrid) but kvwatch found no recurrent layer and
    config.json lists no layer kinds: the plan would be attention-only by default, so it says so."""
    geometry = geometry_from_config(_llama_like("Qwen3_5ForCausalLM", "qwen3_5_unseen_text"))
    (reason,) = architecture_unknowns(geometry, parse_version("0.32.0"))
    assert "Qwen3_5ForCausalLM is a hybrid in vLLM 0.32.0" in reason
    # listed all-attention layers (a dense variant of a hybrid class) are taken as they are
    dense = geometry_from_config(_llama_like("GraniteMoeHybridForCausalLM", "granitemoehybrid",
                                             layer_types=["attention"] * 4))
    assert architecture_unknowns(dense, parse_version("0.32.0")) == ()


@pytest.mark.parametrize("wrapper", sorted(LANGUAGE_MODELS))
def test_a_wrapper_takes_its_language_models_verdict(wrapper: str) -> None:
    """A multimodal wrapper the table lists with no cache kind of its own (it delegates to text_config)
    is planned only where its language model is: Step5's VL model builds the Step5 text model, whose
    tail ring and summary cache planner/step5_sparse.py plans."""
    language_model = LANGUAGE_MODELS[wrapper]
    releases = [r for r, table in sorted(ARCHITECTURES.items()) if wrapper in table]
    assert releases
    for release in releases:
        outer, inner = ARCHITECTURES[release][wrapper], ARCHITECTURES[release][language_model]
        assert delegates(outer) and not outer.kinds and outer.source == inner.source
        assert verdict(wrapper, release).handling == verdict(language_model, release).handling
    assert verdict("Step5ForConditionalGeneration", "0.34.0").handling == PLANNED


def test_a_step5_vl_config_is_planned_as_its_text_model_not_as_full_attention(tmp_path: Path, capsys) -> None:
    text = {"model_type": "step5", "hidden_size": 512, "num_attention_heads": 8, "num_attention_groups": 2,
            "head_dim": 192, "num_hidden_layers": 4, "vocab_size": 1000, "sliding_window": 64,
            "att_impl_type": "GQA", "sparse_config": {"enabled": True}, "max_position_embeddings": 4096}
    config = {"architectures": ["Step5ForConditionalGeneration"], "model_type": "step5_vl",
              "text_config": text, "torch_dtype": "bfloat16"}
    rc, out = _plan(config, tmp_path, capsys, "--vllm-version", "0.34.0")
    assert rc == 0
    assert "step5_dsa" in out and "Step5 outside the one scope kvwatch checked against vLLM's own code: " \
           "cpu: only CUDA SM 9.0 is checked" in out
