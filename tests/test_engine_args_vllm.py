"""kvwatch reads an engine command the way the installed vLLM's own parser does (differential test).

Imports vLLM (its argument parser only, no engine): marked `engine` with the real-engine tests.
tests/test_engine_args_releases.py checks every release, from recorded answers and live.
"""
from __future__ import annotations

import pytest
from script_loader import load_script

from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.serve_options import release_options

pytestmark = pytest.mark.engine



@pytest.fixture(scope="module")
def installed():  # type: ignore[no-untyped-def]
    from engine_support import require_engine
    require_engine()
    reader = load_script("vllm_release_parser")
    parser, release, _, sites = reader.load(None)
    return reader, parser, release, sites


def test_the_option_table_is_the_installed_vllms(installed) -> None:  # type: ignore[no-untyped-def]
    reader, parser, release, sites = installed
    theirs = {o for a in reader.describe(parser, sites) for o in a["options"]}
    ours = set(release_options(release).by_spelling)
    assert theirs == ours, "rerun scripts/gen_vllm_flags.py for this vLLM"


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
def test_settings_equal_vllms_parse(installed, flags: list[str]) -> None:  # type: ignore[no-untyped-def]
    _, parser, release, _ = installed
    ours = EngineCommand.parse(["vllm", "serve", "m", *flags], release).settings()
    theirs = parser.parse_args(["m", *flags])
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
