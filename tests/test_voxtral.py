"""Voxtral (issue 39): planned as its language model where vLLM builds its audio encoder without a
cache, and with its causal encoder's pooled sliding-window caches where vLLM builds that one
(planner/voxtral.py, planner/voxtral_encoder.py); a Voxtral params.json read where vLLM reads it.

vLLM's own code is the oracle, twice. scripts/oracle_voxtral.py runs each release's Mistral-format
parser (transformers_utils/configs/mistral.py adapt_config_dict) on the real Voxtral Mini 4B Realtime
params.json and on the same file without `encoder_args.causal`; scripts/oracle_voxtral_cache.py runs the
release's own WhisperCausalAttentionWithBlockPooling.get_kv_cache_spec, spec classes, grouping, sizing,
per-request reservation, concurrency and reported tokens on that model's layers. Their answers for vLLM
0.32.0, 0.33.0 and 0.34.0 are recorded in tests/fixtures/voxtral_oracle.json and voxtral_cache_oracle.json;
where the unpacked releases are there (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...), the oracles are run
again and must give them. Record them anew with `KVWATCH_VLLM_SRC=... python tests/test_voxtral.py`.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.voxtral import VOXTRAL
from packed_plan_support import serve_plan
from vllm_sources import SpecOracle

from kvwatch.boundary.model_source import load_model_source
from kvwatch.cli import main
from kvwatch.errors import ConfigError
from kvwatch.planner.architecture_kinds import PLANNED, verdict
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.layers import FULL
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.voxtral import (
    CAUSAL_POOLING,
    DEFAULT_MAX_POSITIONS,
    causal_encoder,
    is_audio_params,
    params_config,
)
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.architectures import ARCHITECTURES

ROOT = Path(__file__).resolve().parent.parent
ORACLE = SpecOracle(ROOT / "scripts/oracle_voxtral.py", ROOT / "tests" / "fixtures" / "voxtral_oracle.json",
                    "scripts/oracle_voxtral.py on vLLM 0.32.0, 0.33.0 and 0.34.0's own transformers_utils/configs/mistral.py")
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
MINI_3B = VOXTRAL["voxtral_mini_3b_2507"]["config"]
REALTIME = VOXTRAL["voxtral_mini_4b_realtime_2602"]["params"]
VOXTRAL_ARCHITECTURES = ("VoxtralForConditionalGeneration", "VoxtralRealtimeGeneration")


def _without_causal(params: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(params)
    del changed["multimodal"]["whisper_model_args"]["encoder_args"]["causal"]
    return changed


CASES = [REALTIME, _without_causal(REALTIME)]
CACHE = SpecOracle(ROOT / "scripts/oracle_voxtral_cache.py", ROOT / "tests" / "fixtures" / "voxtral_cache_oracle.json",
                   "scripts/oracle_voxtral_cache.py on vLLM 0.32.0, 0.33.0 and 0.34.0's own whisper_causal.py, "
                   "kv_cache_interface.py, kv_cache_planning.py and kv_cache_utils.py")
GiB = 1 << 30
# (TP, block size, KV dtype, max_model_len, tokens in flight: two batches of --max-num-batched-tokens, KV memory)
CACHE_RUNS = [(1, 16, "bfloat16", 16384, 16384, 40 * GiB), (2, 16, "bfloat16", 131072, 16384, 20 * GiB),
              (1, 32, "fp8", 32768, 4096, 10 * GiB), (4, 16, "bfloat16", 4096, 2048, 8 * GiB)]


def _cache_case(tp: int, block: int, dtype: str, max_len: int, in_flight: int, memory: int) -> dict[str, Any]:
    """The cache oracle's case for Voxtral Mini 4B Realtime as kvwatch reads its params.json."""
    config = params_config(REALTIME, None)
    text, encoder = config["text_config"], causal_encoder(config)
    assert encoder is not None
    return {"lm": {"layers": text["num_hidden_layers"], "kv_heads": text["num_key_value_heads"],
                   "head_size": text["head_dim"], "window": text["sliding_window"]},
            "encoder": {"layers": encoder.layers, "heads": encoder.heads, "head_dim": encoder.head_dim,
                        "window": encoder.window, "pool": encoder.pool},
            "tp": tp, "block_size": block, "dtype": dtype, "max_model_len": max_len, "max_in_flight_tokens": in_flight,
            "memory": memory}


CACHE_CASES = [_cache_case(*run) for run in CACHE_RUNS]


def test_the_recorded_oracle_is_for_these_cases() -> None:
    assert ORACLE.recorded()["cases"] == dict.fromkeys(RELEASES, CASES)


@pytest.mark.parametrize("release", RELEASES)
def test_the_oracle_gives_the_recorded_answers(release: str) -> None:
    ORACLE.check_live(release)


@pytest.mark.parametrize("release", RELEASES)
def test_the_encoder_follows_the_causal_flag_as_vllms_parser_sets_it(release: str) -> None:
    """vLLM names a causal params.json VoxtralRealtimeGeneration and pools its encoder (block_pool_size the
    downsample factor); kvwatch's reading places the causal encoder exactly there."""
    answers = ORACLE.recorded()["answers"][release]
    assert [(a["architectures"], a["audio"]["is_causal"], a["audio"]["block_pool_size"]) for a in answers] == [
        (["VoxtralRealtimeGeneration"], True, 4), (["VoxtralForConditionalGeneration"], False, 1)]
    assert [causal_encoder(params_config(case, None)) is not None for case in CASES] == [True, False]


@pytest.mark.parametrize("release", RELEASES)
def test_the_table_plans_both_voxtrals(release: str) -> None:
    assert {a: verdict(a, release).handling for a in VOXTRAL_ARCHITECTURES} == dict.fromkeys(VOXTRAL_ARCHITECTURES,
                                                                                            PLANNED)
    assert CAUSAL_POOLING in ARCHITECTURES[release]["VoxtralRealtimeGeneration"].kinds


def test_voxtral_mini_3b_is_planned_as_its_language_model() -> None:
    geometry = geometry_from_config(MINI_3B, "0.34.0")
    text = MINI_3B["text_config"]
    assert (geometry.layout.kinds, geometry.num_kv_heads, geometry.head_size, geometry.default_max_model_len) == (
        (FULL,) * text["num_hidden_layers"], text["num_key_value_heads"], text["head_dim"],
        text["max_position_embeddings"])
    settings = EngineCommand.parse(["vllm", "serve", "mistralai/Voxtral-Mini-3B-2507", "--max-model-len", "32768"]).settings()
    plan = make_plan(geometry, settings, preset("h100"), ruleset_for("0.34.0"),
                     MemoryInputs(vllm_version=parse_version("0.34.0")))
    assert plan.unknown_layer_types == () and plan.kv_cache_groups == 1
    assert plan.kv_bytes_per_token == 2 * text["num_hidden_layers"] * text["num_key_value_heads"] * text["head_dim"] * 2


@pytest.mark.parametrize(("audio", "named"), [
    ({"is_causal": True}, "audio_config.encoder_layers"),
    ({"is_causal": True, "encoder_layers": 32, "encoder_attention_heads": 32, "encoder_head_dim": 64,
      "sliding_window": 750, "block_pool_size": 1}, "block_pool_size must be above 1")])
def test_a_causal_audio_config_without_its_encoder_sizes_is_refused_naming_them(audio: dict[str, Any],
                                                                               named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        geometry_from_config({**MINI_3B, "audio_config": audio})


def test_only_a_voxtral_config_gets_the_causal_encoder() -> None:
    causal = {"is_causal": True, "encoder_layers": 32, "encoder_attention_heads": 32, "encoder_head_dim": 64,
              "sliding_window": 750, "block_pool_size": 4}
    assert geometry_from_config({**MINI_3B, "audio_config": causal}).layout.causal_encoder is not None
    other = {**MINI_3B, "model_type": "qwen2_audio", "audio_config": {"is_causal": True}}
    assert geometry_from_config(other).layout.causal_encoder is None


def test_kvwatch_plan_of_voxtral_mini_3b_exits_0_and_is_classified(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "voxtral").mkdir()
    (tmp_path / "voxtral" / "config.json").write_text(json.dumps(MINI_3B))
    assert main(["plan", "--preset", "h100", "--", "vllm", "serve", str(tmp_path / "voxtral"),
                 "--max-model-len", "32768"]) == 0
    assert "UNKNOWN" not in capsys.readouterr().out


def test_the_hf_config_reads_as_vllm_reads_it(tmp_path: Path) -> None:
    """vLLM 0.32's own reading of the HF-format config (transformers' VoxtralConfig): its text config's
    length, head size and KV heads are kvwatch's, and its audio config has no `is_causal`, so
    VoxtralEncoderModel builds the cacheless WhisperEncoder (`getattr(config, "is_causal", False)`)."""
    pytest.importorskip("vllm.config")
    from transformers import AutoConfig
    from vllm.transformers_utils.config import get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
    (tmp_path / "config.json").write_text(json.dumps(MINI_3B))
    hf = AutoConfig.from_pretrained(str(tmp_path))
    text = get_hf_text_config(hf)
    vllm_reads = ModelArchConfigConvertorBase(hf, text)
    geometry = geometry_from_config(MINI_3B, "0.32.0")
    length, key = vllm_reads.derive_max_model_len_and_key()
    assert (geometry.default_max_model_len, geometry.derived_max_model_len_key) == (length, key)
    assert (geometry.head_size, geometry.num_kv_heads, geometry.num_layers) == (
        vllm_reads.get_head_size(), vllm_reads.get_total_num_kv_heads(), text.num_hidden_layers)
    assert getattr(hf.audio_config, "is_causal", False) is False


@pytest.mark.parametrize("release", RELEASES)
def test_the_release_builds_the_causal_encoder_only_for_a_causal_audio_config(release: str) -> None:
    tree = ORACLE.tree(release)
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    models = tree / "vllm" / "model_executor" / "models"
    encoder = (models / "voxtral.py").read_text(encoding="utf-8").split("class VoxtralEncoderModel", 1)[1]
    assert 'self.is_causal = getattr(self.config, "is_causal", False)' in encoder
    assert "if self.is_causal:\n            WhisperEncoderCls = WhisperCausalEncoder" in encoder
    causal = (models / "whisper_causal.py").read_text(encoding="utf-8")
    assert f"class {CAUSAL_POOLING}(Attention)" in causal and "tokens_per_state=Fraction(1, self.block_pool_size)" in causal


def test_the_recorded_cache_oracle_is_for_these_cases() -> None:
    assert CACHE.recorded()["cases"] == dict.fromkeys(RELEASES, CACHE_CASES)


@pytest.mark.parametrize("release", RELEASES)
def test_the_cache_oracle_gives_the_recorded_answers(release: str) -> None:
    CACHE.check_live(release)


def _realtime_plan(case: dict[str, Any], release: str, *more: str) -> Plan:
    flags = ["-tp", str(case["tp"]), "--block-size", str(case["block_size"]), "--max-model-len",
             str(case["max_model_len"]), "--max-num-batched-tokens", str(case["max_in_flight_tokens"] // 2),
             "--kv-cache-memory-bytes", str(case["memory"]), *(("--kv-cache-dtype", "fp8") if case["dtype"] == "fp8" else ())]
    return serve_plan(params_config(REALTIME, None), release, "mistralai/Voxtral-Mini-4B-Realtime-2602", *flags, *more)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("index", range(len(CACHE_RUNS)))
def test_the_realtime_plan_equals_vllms_own_specs_and_sizing(release: str, index: int) -> None:
    """The encoder's pooled window and page, the groups, the bytes per block, the blocks, the blocks one
    request reserves, the concurrency and the tokens vLLM logs: kvwatch's plan gives vLLM's own."""
    case, answer = CACHE_CASES[index], CACHE.recorded()["answers"][release][index]
    encoder = causal_encoder(params_config(REALTIME, None))
    assert encoder is not None
    dtype_bytes = 1 if case["dtype"] == "fp8" else 2
    assert (encoder.pooled_window, encoder.page_bytes(case["block_size"], case["tp"], dtype_bytes)) == (
        answer["encoder"]["window"], answer["encoder"]["page_size_bytes"])
    assert answer["encoder"]["tokens_per_state"] == f"1/{encoder.pool}"
    plan = _realtime_plan(case, release)
    assert plan.unknown_layer_types == ()
    assert (plan.kv_cache_groups, plan.bytes_per_block, plan.num_blocks, plan.blocks_per_request,
            plan.kv_cache_tokens) == (len(answer["groups"]), answer["bytes_per_block"], answer["num_blocks"],
                                      sum(g["blocks_per_request"] for g in answer["groups"]), answer["kv_cache_tokens"])
    assert plan.max_concurrency == pytest.approx(answer["max_concurrency"])
    assert plan.block_size == min(g["block_size"] for g in answer["groups"])


def test_the_recorded_figures_of_voxtral_realtime() -> None:
    """At TP 1, block 16, bf16: the encoder's 524,288-B pages (32 heads x 16 tokens x 4 frames x 2 x 64 x
    2 B), the language model's blocks scaled to 128 tokens to match, two groups of 32 layers' pages."""
    answer = CACHE.recorded()["answers"]["0.34.0"][0]
    assert [(g["layers"], g["encoder_layers"], g["block_size"], g["page_size_bytes"]) for g in answer["groups"]] == [
        (26, 0, 128, 524288), (32, 32, 16, 524288)]
    assert (answer["bytes_per_block"], answer["num_blocks"], answer["kv_cache_tokens"]) == (16777216, 2560, 36345)


@pytest.mark.parametrize(("flags", "named"), [
    (("-pp", "2"), "pipeline parallelism"),
    (("--disable-hybrid-kv-cache-manager",), "--disable-hybrid-kv-cache-manager")])
def test_a_command_beyond_the_checked_scope_is_marked_unknown(flags: tuple[str, ...], named: str) -> None:
    plan = _realtime_plan(CACHE_CASES[0], "0.34.0", *flags)
    assert any(named in u and CAUSAL_POOLING in u for u in plan.unknown_layer_types)


def _as_the_oracle_answers(config: dict[str, Any]) -> dict[str, Any]:
    """kvwatch's reading of a params.json (params_config) in the oracle's answer's terms."""
    audio, text = config["audio_config"], config["text_config"]
    return {
        "architectures": config["architectures"], "model_type": config["model_type"],
        "audio": {"is_causal": audio["is_causal"], "block_pool_size": audio["block_pool_size"],
                  "sliding_window": audio["sliding_window"], "layers": audio["encoder_layers"],
                  "heads": audio["encoder_attention_heads"], "head_dim": audio["encoder_head_dim"],
                  "d_model": audio["d_model"]},
        "text": {"architectures": text["architectures"], "layers": text["num_hidden_layers"],
                 "kv_heads": text["num_key_value_heads"], "head_dim": text["head_dim"],
                 "sliding_window": text.get("sliding_window"), "layer_types": sorted(set(text.get("layer_types") or ())),
                 "max_position_embeddings": text["max_position_embeddings"]},
    }


@pytest.mark.parametrize("release", RELEASES)
def test_kvwatch_reads_a_params_json_as_vllms_parser_does(release: str) -> None:
    """params_config of each case gives the architecture, encoder and language model vLLM's own parser
    gives (no HF config.json beside it: max_position_embeddings its default)."""
    answers = ORACLE.recorded()["answers"][release]
    assert [_as_the_oracle_answers(params_config(case, None)) for case in CASES] == answers
    assert answers[0]["text"]["max_position_embeddings"] == DEFAULT_MAX_POSITIONS


def test_the_length_comes_from_params_json_then_the_hf_config_beside_it() -> None:
    assert params_config(REALTIME, 131072)["text_config"]["max_position_embeddings"] == 131072
    assert params_config({**REALTIME, "max_position_embeddings": 32768}, 131072)["text_config"][
        "max_position_embeddings"] == 32768
    layered = params_config({**REALTIME, "sliding_window": [None, 4096]}, None)["text_config"]
    assert (layered["layer_types"][:2], layered["sliding_window"]) == (["full_attention", "sliding_attention"], 4096)


@pytest.mark.parametrize(("params", "audio"), [
    (REALTIME, True), (_without_causal(REALTIME), True), ({"dim": 4096, "n_layers": 32}, False),
    ({**REALTIME, "multimodal": {"whisper_model_args": {"encoder_args": []}}}, False),
    ({**REALTIME, "multimodal": {"vision_encoder_args": {"n_layers": 24}}}, False)])
def test_only_voxtrals_params_json_is_read(params: dict[str, Any], audio: bool) -> None:
    assert is_audio_params(params) is audio


@pytest.mark.parametrize("bad", [
    {"n_layers": "26"}, {"n_layers": True}, {"sliding_window": [None, "x"], "n_layers": "x"},
    {"multimodal": {"whisper_model_args": {"encoder_args": {"causal": True, "n_layers": 32},
                                           "downsample_args": {"downsample_factor": 4}}}},
    {"multimodal": {"whisper_model_args": {"encoder_args": {**REALTIME["multimodal"]["whisper_model_args"]["encoder_args"],
                                                            "sliding_window": "750"},
                                           "downsample_args": {}}}}])
def test_a_malformed_params_json_is_one_config_error(bad: dict[str, Any]) -> None:
    """A params.json kvwatch reads is refused naming its field, never a traceback."""
    with pytest.raises(ConfigError):
        geometry_from_config(params_config({**REALTIME, **bad}, None))


def _mistral_repo(path: Path, params: dict[str, Any], config: dict[str, Any] | None = None,
                  consolidated: bool = True) -> Path:
    path.mkdir()
    (path / "params.json").write_text(json.dumps(params))
    if consolidated:
        (path / "consolidated.safetensors").write_bytes(b"")
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_mistral_repository_is_read_from_its_params_json(tmp_path: Path) -> None:
    """Where vLLM reads params.json (consolidated*.safetensors beside it), kvwatch does too, taking the
    HF config.json's length when params.json names none; without the consolidated weights, config.json."""
    hf = {**MINI_3B, "text_config": {**MINI_3B["text_config"], "max_position_embeddings": 65536}}
    source = load_model_source(str(_mistral_repo(tmp_path / "realtime", REALTIME, hf)))
    assert source.config == params_config(REALTIME, 65536)
    assert load_model_source(str(_mistral_repo(tmp_path / "hf", REALTIME, MINI_3B, consolidated=False))).config == MINI_3B
    plain = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128}
    assert load_model_source(str(_mistral_repo(tmp_path / "text", plain, MINI_3B))).config == MINI_3B


def test_the_hf_cache_snapshot_of_a_params_json_only_repository_is_found(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "models--mistralai--Voxtral-Mini-4B-Realtime-2602"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abc")
    (repo / "snapshots").mkdir()
    _mistral_repo(repo / "snapshots" / "0123abc", REALTIME)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert load_model_source("mistralai/Voxtral-Mini-4B-Realtime-2602").config == params_config(REALTIME, None)


def test_kvwatch_plan_of_voxtral_realtime_is_planned_with_its_encoder(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Voxtral Mini 4B Realtime's repository (params.json, consolidated.safetensors, no config.json): the
    language model's 26 sliding layers and the encoder's 32 pooled ones, two groups, exit 0."""
    repo = _mistral_repo(tmp_path / "realtime", REALTIME)
    assert main(["plan", "--preset", "h100", "--", "vllm", "serve", str(repo), "--max-model-len", "16384"]) == 0
    out = capsys.readouterr().out
    assert "UNKNOWN" not in out and "KV cache groups  2 of 32 layers, 6 padding layer(s)" in out
    geometry = geometry_from_config(params_config(REALTIME, None), "0.34.0")
    assert (set(geometry.layout.kinds), geometry.sliding_window, geometry.num_kv_heads, geometry.num_layers) == (
        {"sliding"}, REALTIME["sliding_window"], REALTIME["n_kv_heads"], REALTIME["n_layers"])


if __name__ == "__main__":   # record the oracles' answers (KVWATCH_VLLM_SRC must name the unpacked releases)
    ORACLE.record(dict.fromkeys(RELEASES, CASES))
    CACHE.record(dict.fromkeys(RELEASES, CACHE_CASES))
