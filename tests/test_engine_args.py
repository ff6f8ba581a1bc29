"""The engine command as the user runs it: read every planning flag, rewrite one, keep the rest."""
from __future__ import annotations

import pytest

from kvwatch.errors import KvwatchError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.units import parse_size, parse_vllm_int

SERVE = ["vllm", "serve", "/models/m"]
API = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]


@pytest.mark.parametrize("prefix", [SERVE, API])
def test_reads_every_planning_flag_in_both_forms(prefix):
    command = EngineCommand.parse([*prefix, "--block-size=32", "--kv-cache-dtype", "fp8", "--dtype", "half",
                                   "--gpu-memory-utilization=0.85", "--kv-cache-memory-bytes", "2G",
                                   "--max-model-len", "32k", "--max-num-seqs", "64", "-tp", "4",
                                   "--num-gpu-blocks-override=100", "--attention-backend", "TRITON_ATTN",
                                   "--moe-backend", "marlin"])
    s = command.settings()
    assert s.model == "/models/m"
    assert (s.block_size, s.kv_cache_dtype, s.dtype) == (32, "fp8", "half")
    assert s.gpu_memory_utilization == 0.85
    assert s.kv_cache_memory_bytes == 2 * 2**30
    assert s.max_model_len == 32_000
    assert (s.max_num_seqs, s.tensor_parallel_size, s.num_gpu_blocks_override) == (64, 4, 100)
    assert s.attention_backend == "TRITON_ATTN"
    assert s.moe_backend == "marlin"


def test_defaults_are_vllms():
    s = EngineCommand.parse(SERVE).settings()
    assert (s.block_size, s.kv_cache_dtype, s.gpu_memory_utilization, s.tensor_parallel_size) == (None, "auto", 0.92, 1)
    assert s.moe_backend is None


def test_underscore_spelling_and_last_value_wins():
    command = EngineCommand.parse([*SERVE, "--block_size", "16", "--block-size", "64"])
    assert command.settings().block_size == 64


def test_rewrite_replaces_in_place_and_keeps_everything_else():
    argv = [*SERVE, "--enforce-eager", "--block-size=8", "--port", "8001", "--block-size", "16"]
    fixed = EngineCommand.parse(argv).with_flag("--block-size", 32)
    assert fixed.argv == ("vllm", "serve", "/models/m", "--enforce-eager", "--block-size=32", "--port", "8001")


def test_rewrite_adds_a_missing_flag_at_the_end_and_removes_one():
    command = EngineCommand.parse([*API, "--kv-cache-dtype", "fp8"])
    assert command.with_flag("--max-model-len", 4096).argv[-2:] == ("--max-model-len", "4096")
    assert "--kv-cache-dtype" not in command.without_flag("--kv-cache-dtype").argv
    assert command.apply({"--kv-cache-dtype": "auto"}, remove=["--model"]).argv == (
        "python", "-m", "vllm.entrypoints.openai.api_server", "--kv-cache-dtype", "auto")


def test_health_url_from_host_and_port():
    assert EngineCommand.parse([*SERVE, "--host", "0.0.0.0", "--port", "9000"]).health_url() == "http://127.0.0.1:9000"
    assert EngineCommand.parse([*SERVE, "--host", "::1"]).health_url() == "http://[::1]:8000"


@pytest.mark.parametrize("argv,needle", [
    ([], "no engine command"),
    (["vllm", "serve"], "names no model"),
    ([*SERVE, "--block-size"], "expected one argument"),
    ([*SERVE, "--block-size", "x"], "argument --block-size: invalid int value: 'x'"),
    ([*SERVE, "--gpu-memory-utilization", "lots"], "invalid float value: 'lots'"),
    ([*SERVE, "--kv-cache-memory-bytes", "1.5.5G"], "invalid human_readable_int value: '1.5.5G'"),
])
def test_bad_commands_are_one_clear_error(argv, needle):
    with pytest.raises(KvwatchError, match=needle):  # CommandError is a KvwatchError
        EngineCommand.parse(argv).settings()


@pytest.mark.parametrize("text,value", [("1k", 1000), ("1K", 1024), ("2G", 2 * 2**30), ("25.6k", 25_600),
                                        ("1073741824", 2**30)])
def test_vllm_human_readable_ints(text, value):
    assert parse_vllm_int(text) == value


@pytest.mark.parametrize("text,value", [("96GiB", 96 * 2**30), ("80GB", 80 * 10**9), ("512 MiB", 512 * 2**20),
                                        ("1024", 1024)])
def test_sizes(text, value):
    assert parse_size(text) == value
