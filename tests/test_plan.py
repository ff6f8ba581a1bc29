"""The planner against vLLM's own formulas and the figures measured on the real engine (docs/vllm-facts.md §1-§3)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_support import deepseek_v2_config, llama_config, write_model

from kvwatch.cli import main
from kvwatch.errors import ConfigError
from kvwatch.planner.devices import Device, GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import NO_MEMORY_INPUTS, MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

RULES = ruleset_for("0.32.0")
CPU = Device("cpu", "cpu", cpu_fp8_kv=True)
CPU_NO_AVX512 = Device("cpu", "cpu", cpu_fp8_kv=False)
KIMI = json.loads((Path(__file__).parent.parent / "examples/kimi-k2/config.json").read_text())


def plan_for(config, *flags, device=CPU, kv_gib=1):
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    memory = MemoryInputs(cpu_kv_space_bytes=kv_gib * GiB if device.platform == "cpu" else None)
    return make_plan(geometry_from_config(config), settings, device, RULES, memory)


@pytest.mark.parametrize("config,flags,blocks", [
    # Measured on the real CPU engine with 1 GiB of KV (docs/vllm-facts.md §2).
    (llama_config(layers=2, kv_heads=2, head_dim=16), ["--block-size", "128"], 32768),
    (llama_config(layers=3, kv_heads=1, head_dim=64), ["--block-size", "64"], 21845),
])
def test_cpu_blocks_match_measured_engine(config, flags, blocks):
    plan = plan_for(config, *flags)
    assert plan.num_blocks == blocks
    assert not plan.estimated
    assert plan.kv_cache_tokens == blocks * plan.block_size


def test_kimi_k2_bytes_per_token():
    fp8 = plan_for(KIMI, "--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "40G", device=preset("h200"))
    bf16 = plan_for(KIMI, "--kv-cache-memory-bytes", "40G", device=preset("h200"))
    assert fp8.kv_bytes_per_token == 35_136
    assert bf16.kv_bytes_per_token == 70_272
    assert fp8.attention == bf16.attention == "mla"


def test_tensor_parallelism_does_not_divide_mla():
    one = plan_for(KIMI, "--kv-cache-memory-bytes", "40G", device=preset("h200"))
    eight = plan_for(KIMI, "--kv-cache-memory-bytes", "40G", "-tp", "8", device=preset("h200"))
    assert one.kv_bytes_per_token == eight.kv_bytes_per_token == 70_272
    assert one.num_blocks == eight.num_blocks


def test_tensor_parallelism_divides_gqa_heads():
    config = llama_config(kv_heads=8, heads=8, head_dim=128)
    one = plan_for(config, "--kv-cache-memory-bytes", "8G", device=preset("h100"))
    four = plan_for(config, "--kv-cache-memory-bytes", "8G", "-tp", "4", device=preset("h100"))
    assert one.kv_bytes_per_token == 4 * four.kv_bytes_per_token


def test_sm120_fp8_mla_warns_kernel_shared_memory_and_proposes_auto():
    plan = plan_for(KIMI, "--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "40G", device=preset("rtx-pro-6000"))
    assert plan.backend == "TRITON_MLA"
    kinds = {w.kind: w for w in plan.warnings}
    assert kinds["kernel_out_of_resources"].fix == FlagChange({"--kv-cache-dtype": "auto"})
    assert "--block-size" not in plan.fixes()
    assert plan.will_fail


def test_sm120_auto_kv_is_clean():
    plan = plan_for(KIMI, "--kv-cache-memory-bytes", "40G", device=preset("rtx-pro-6000"))
    assert plan.warnings == ()


@pytest.mark.parametrize("device,release,backend,block", [
    ("h200", "0.33.0", "FLASH_ATTN_MLA", 16), ("b200", "0.33.0", "FLASHINFER_MLA", 32),
    # 0.34's default block size 64 (vllm/config/cache.py:185), where the backend accepts it
    # (AttentionBackend.get_preferred_block_size, vllm/v1/attention/backend.py:158-166)
    ("h200", "0.34.0", "FLASH_ATTN_MLA", 64), ("b200", "0.34.0", "FLASHINFER_MLA", 64)])
def test_mla_backend_and_default_block_size_by_gpu(device, release, backend, block):
    settings = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-memory-bytes", "40G"], release).settings()
    plan = make_plan(geometry_from_config(KIMI), settings, preset(device), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))
    assert (plan.backend, plan.block_size, plan.block_size_source) == (backend, block, "backend default")


def test_illegal_gpu_block_size_gets_smallest_legal_fix():
    plan = plan_for(llama_config(), "--block-size", "20", "--kv-cache-memory-bytes", "1G", device=preset("h100"))
    assert plan.warnings[0].kind == "block_size_unsupported"
    assert plan.fixes() == FlagChange({"--block-size": 32})


def test_cpu_block_size_8_needs_multiple_of_32():
    plan = plan_for(llama_config(), "--block-size", "8")
    assert plan.fixes() == FlagChange({"--block-size": 32})


def test_cpu_fp8_without_avx512_is_refused():
    plan = plan_for(llama_config(head_dim=32), "--kv-cache-dtype", "fp8", device=CPU_NO_AVX512)
    assert [w.kind for w in plan.warnings] == ["kv_dtype_unsupported"]
    assert plan.fixes() == FlagChange({"--kv-cache-dtype": "auto"})
    # vLLM still sizes the cache with CPU_ATTN's 128-token blocks before the kernel refuses fp8.
    assert plan.block_size == 128 and plan.num_blocks == GiB // (128 * 2 * 2 * 32 * 2)


def test_cpu_fp8_head_size_16_is_refused_even_with_avx512():
    plan = plan_for(llama_config(head_dim=16), "--kv-cache-dtype", "fp8")
    assert plan.warnings[0].kind == "kv_dtype_unsupported"
    assert "divisible by 32" in plan.warnings[0].message


def test_cpu_fp8_head_size_32_is_one_byte_per_element():
    plan = plan_for(llama_config(head_dim=32), "--kv-cache-dtype", "fp8")
    assert plan.warnings == () and plan.dtype_bytes == 1
    assert plan.num_blocks == GiB // (128 * 2 * 2 * 32 * 2)


def test_max_model_len_beyond_kv_space_matches_engine_estimate():
    # Real engine: 4 layers, 8 kv heads, head 64, bf16, 1 GiB -> "estimated maximum model length is 130944".
    plan = plan_for(llama_config(layers=4, kv_heads=8, heads=8, head_dim=64, max_len=262144),
                    "--max-model-len", "262144")
    warning = plan.warnings[0]
    assert warning.kind == "kv_cache_too_small"
    assert warning.fix == FlagChange({"--max-model-len": 130944})


def test_cpu_mla_block_size_is_forced_to_16():
    plan = plan_for(deepseek_v2_config(), "--block-size", "128")
    assert (plan.backend, plan.block_size, plan.block_size_source) == ("CPU_MLA", 16, "platform override")
    assert plan.kv_bytes_per_token_per_layer == 576 * 2


def test_float32_and_auto_downcast():
    f32 = llama_config(dtype="float32")
    assert plan_for(f32).dtype_bytes == 2                       # auto downcasts float32 to bf16
    assert plan_for(f32, "--dtype", "float32").dtype_bytes == 4


def test_fp8_ds_mla_packed_layout_is_padding():
    plan = plan_for(KIMI, "--kv-cache-dtype", "fp8_ds_mla", "--kv-cache-memory-bytes", "40G", device=preset("h200"))
    assert plan.kv_bytes_per_token_per_layer == 656
    assert plan.padding_bytes["packed_layout"] == (656 - 576) * plan.block_size * 61 * plan.num_blocks


def test_padding_remainder_and_null_block():
    plan = plan_for(llama_config(layers=3, kv_heads=1, head_dim=64), "--block-size", "64")
    assert plan.padding_bytes["null_block"] == plan.bytes_per_block
    assert plan.padding_bytes["remainder"] == GiB - plan.num_blocks * plan.bytes_per_block


def test_sliding_window_hybrid_groups():
    config = llama_config(layers=6, sliding_window=512,
                          layer_types=["sliding_attention"] * 5 + ["full_attention"])
    plan = plan_for(config, "--block-size", "32")
    # vLLM: 5 sliding + 1 full -> groups of 1 layer, so a block spans one layer's page.
    assert plan.layers_per_block == 1


def test_num_gpu_blocks_override_wins():
    plan = plan_for(llama_config(), "--num-gpu-blocks-override", "100")
    assert plan.num_blocks == 100 and not plan.estimated


def test_gpu_estimate_is_marked():
    plan = plan_for(llama_config(), device=preset("h100"))
    assert plan.estimated and plan.num_blocks > 0


@pytest.mark.parametrize("config,field", [
    ({"model_type": "llama"}, "num_hidden_layers"),
    ({"num_hidden_layers": 2}, "model_type"),
    ({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4}, "head_dim"),
    ({"model_type": "deepseek_v3", "num_hidden_layers": 2, "num_attention_heads": 4, "kv_lora_rank": 512},
     "qk_rope_head_dim"),
    ({"model_type": "llama", "num_hidden_layers": "two", "num_attention_heads": 4}, "num_hidden_layers"),
])
def test_malformed_config_names_the_field(config, field):
    with pytest.raises(ConfigError, match=field):
        geometry_from_config(config)


def test_cli_exit_codes(tmp_path):
    model = write_model(tmp_path / "m", llama_config())
    kimi = str(Path(__file__).parent.parent / "examples/kimi-k2")
    assert main(["plan", "--device", "cpu", "--", "vllm", "serve", str(model)]) == 0
    assert main(["plan", "--preset", "rtx-pro-6000", "--", "vllm", "serve", kimi,
                 "--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "20G"]) == 3


def test_cli_json_fields(tmp_path, capsys):
    kimi = str(Path(__file__).parent.parent / "examples/kimi-k2")
    rc = main(["plan", "--compute-capability", "12.0", "--gpu-memory", "96GiB", "--json", "--",
               "vllm", "serve", kimi, "--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "20G"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 3
    for key in ("block_size", "kv_cache_dtype", "attention", "backend", "kv_bytes_per_token",
                "bytes_per_block", "num_blocks", "kv_cache_tokens", "estimated", "padding_bytes", "warnings"):
        assert key in data
    assert data["warnings"][0] == {"kind": "kernel_out_of_resources", "message": data["warnings"][0]["message"],
                                   "fix": {"--kv-cache-dtype": "auto"}, "certain": True}


@pytest.mark.parametrize("args,needle", [
    (["plan", "--device", "cpu", "--", "vllm", "serve", "/nonexistent/model"], "no such directory"),
    (["plan", "--device", "cpu"], "no engine command"),
    (["plan", "--preset", "tpu9", "--", "vllm", "serve", "x"], "unknown GPU preset"),
    (["plan", "--device", "cpu", "--", "vllm", "serve", "M", "--block-size", "big"], "invalid int value: 'big'"),
    (["plan", "--bogus"], "unrecognized arguments"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle, tmp_path, capsys):
    if "M" in args:
        args[args.index("M")] = str(write_model(tmp_path / "m", llama_config()))
    try:
        rc = main(args)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_malformed_json_config(tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "llama", ')
    assert main(["plan", "--device", "cpu", "--", "vllm", "serve", str(bad)]) == 2
    assert "malformed JSON" in capsys.readouterr().err


def test_the_plan_says_how_its_kv_memory_is_known() -> None:
    geometry = geometry_from_config(llama_config())
    h100 = preset("h100")

    def source(*flags: str, memory: MemoryInputs = NO_MEMORY_INPUTS) -> tuple[str, bool]:
        settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
        plan = make_plan(geometry, settings, h100, RULES, memory)
        assert plan.to_json()["source"] == plan.source
        return plan.source, plan.estimated

    assert source() == ("estimated", True)
    assert source("--kv-cache-memory-bytes", "8G") == ("exact", False)
    assert source("--num-gpu-blocks-override", "100") == ("exact", False)
    assert source(memory=MemoryInputs(non_kv_bytes=20 * GiB)) == ("learned", False)


def test_mla_on_a_cpu_with_amx_keeps_the_cpus_block_size() -> None:
    """platforms/cpu.py: the reference MLA kernel forces 16-token blocks; with AMX tiles vLLM runs the
    AMX MLA kernel, which does not, so CI on an AMX machine plans what vLLM does there."""
    geometry = geometry_from_config(deepseek_v2_config())
    amx = Device("cpu", "cpu", cpu_fp8_kv=True, cpu_amx=True)
    for flags, expected in (((), 128), (("--block-size", "64"), 64)):
        settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
        assert make_plan(geometry, settings, amx, RULES, MemoryInputs(cpu_kv_space_bytes=GiB)).block_size == expected
        assert make_plan(geometry, settings, CPU, RULES, MemoryInputs(cpu_kv_space_bytes=GiB)).block_size == 16
