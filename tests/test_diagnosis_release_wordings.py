"""The failure wordings 0.33 and 0.34 brought, as their source writes them, diagnosed and remedied."""
from __future__ import annotations

import pytest

from kvwatch.diagnosis import FailureKind, diagnose, propose_remedy
from kvwatch.planner.engine_args import EngineCommand

PREFIX = "(EngineCore pid=77) "


@pytest.mark.parametrize("lines,kind,facts", [
    # vLLM 0.33.0, vllm/platforms/cpu.py:158-162
    ([PREFIX + "ValueError: --kv-cache-dtype fp8 is not supported by MLA attention on CPU."],
     FailureKind.KV_DTYPE_UNSUPPORTED, {"kv_cache_dtype": "fp8", "platform": "cpu"}),
    # vLLM 0.33.0, vllm/config/cache.py:470-474, inside pydantic's validation error
    (["pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig", "cache_dtype",
      "  Value error, Invalid kv_cache_dtype: 'fp7'. Valid values are: ('auto', 'float16') "
      "[type=value_error, input_value='fp7', input_type=str]"],
     FailureKind.KV_DTYPE_UNSUPPORTED, {"kv_cache_dtype": "fp7"}),
    # vLLM 0.33.0, vllm/config/vllm.py:1504-1507
    ([PREFIX + 'ValueError: kv_cache_dtype="float16" is incompatible with dtype="bfloat16". '
      "Please set `--kv-cache-dtype` to `auto` or `bfloat16`."],
     FailureKind.KV_DTYPE_UNSUPPORTED, {"kv_cache_dtype": "float16", "model_dtype": "bfloat16"}),
])
def test_033_wordings(lines: list[str], kind: FailureKind, facts: dict[str, str]) -> None:
    d = diagnose(lines)
    assert d.kind is kind
    assert facts.items() <= d.facts.items()


def test_the_16bit_mismatch_is_fixed_by_auto() -> None:
    d = diagnose([PREFIX + 'ValueError: kv_cache_dtype="float16" is incompatible with dtype="bfloat16". '
                  "Please set `--kv-cache-dtype` to `auto` or `bfloat16`."])
    remedy = propose_remedy(d, EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-dtype", "float16"], "0.33.0"))
    assert remedy is not None and remedy.change.set == {"--kv-cache-dtype": "auto"}


def test_034_extensible_refusal_drops_the_flag() -> None:
    """vLLM 0.34.0, vllm/config/vllm.py:3263, raised from the config's frame."""
    lines = ["Traceback (most recent call last):",
             '  File "/usr/lib/python3/site-packages/vllm/config/vllm.py", line 3263, in _resolve_extensible_kv_cache',
             "ValueError: enable_extensible_kv_cache: it sizes the KV cache from measured memory, which "
             "kv_cache_memory_bytes overrides."]
    d = diagnose(lines)
    assert d.kind is FailureKind.CONFIG_REFUSED and d.facts.get("refusal") == "extensible_kv_cache_unsupported"
    command = EngineCommand.parse(["vllm", "serve", "m", "--enable-extensible-kv-cache",
                                   "--kv-cache-memory-bytes", "20G"], "0.34.0")
    remedy = propose_remedy(d, command)
    assert remedy is not None and remedy.change.remove == ("--enable-extensible-kv-cache",)
