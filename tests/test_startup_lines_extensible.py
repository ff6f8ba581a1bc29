"""vLLM 0.34's start-up lines with the extensible KV cache: the tentative "Available KV cache memory"
line and the final figures after warm-up and extension, built from 0.34's own format strings.

The format strings are vLLM 0.34.0's (cited by file:line); where the unpacked release is present
(KVWATCH_VLLM_SRC=<root>/0.34.0/vllm/...) the test checks them against its source.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from vllm_sources import release_tree_or_skip

from kvwatch.diagnosis.startup_lines import GiB, parse_facts

# vLLM 0.34.0, vllm/v1/worker/gpu_worker.py:795-798 (logger.info_once, format_gib: round(x, 2))
AVAILABLE = ("vllm/v1/worker/gpu_worker.py", 796, "Available KV cache memory: %s GiB")
# vLLM 0.34.0, vllm/v1/worker/extensible_kv_cache.py:693-697
WARMUP = ("vllm/v1/worker/extensible_kv_cache.py", 694,
          "Memory after warmup: %s GiB free, %s GiB committed to the KV cache, "
          "%s GiB kept for transient activations (%s GiB allocated at peak, "
          "%s GiB of torch reservation growth); %d KV cache blocks (%s GiB) "
          "fit within the requested %s GiB. Torch may reserve up to %s GiB.")
# vLLM 0.34.0, vllm/v1/worker/extensible_kv_cache.py:536-540
EXTENDED = ("vllm/v1/worker/extensible_kv_cache.py", 537, "Extended KV cache to %d blocks (%.2f GiB).")
# vLLM 0.34.0, vllm/v1/core/kv_cache_utils.py:1169 (the first part; logged after finalize_extensible_kv_cache)
TOKENS = "GPU KV cache size: %s tokens"
PREFIX = "(EngineCore pid=1234) INFO 12-06 21:00:00 [%s:%d] "


def _line(where: tuple[str, int, str], *args: object) -> str:
    path, line, fmt = where
    return PREFIX % (Path(path).name, line) + fmt % args


def _startup(final_blocks: int, final_gib: float, tentative_gib: str) -> list[str]:
    return [
        _line(AVAILABLE, tentative_gib),
        _line(WARMUP, "61.2", "0.03", "2.72", "2.72", "0.0", final_blocks, f"{final_gib}", "79.18", "3.5"),
        _line(EXTENDED, final_blocks, final_gib),
        PREFIX % ("kv_cache_utils.py", 1) + TOKENS % f"{final_blocks * 64:,}",
    ]


def test_the_final_figure_replaces_the_tentative_one() -> None:
    facts = parse_facts(_startup(17117, 58.51, "63.85"))
    assert facts.available_kv_bytes == int(58.51 * GiB)
    assert facts.kv_cache_bytes == int(58.51 * GiB)
    assert facts.tentative_kv_bytes == int(63.85 * GiB)
    assert facts.sized_after_warmup
    assert facts.settled_kv_bytes == int(58.51 * GiB)
    assert facts.kv_tokens == 17117 * 64
    assert facts.activation_peak_bytes == int(2.72 * GiB)


def test_the_tentative_figure_alone_is_not_settled() -> None:
    """Before the warm-up sizing the profile's figure is an upper bound: not one to learn from."""
    facts = parse_facts(_startup(17117, 58.51, "63.85")[:1])
    assert facts.available_kv_bytes == int(63.85 * GiB)
    assert facts.settled_kv_bytes is None


def test_the_warmup_line_alone_gives_the_final_figure() -> None:
    """A start that fails between the sizing and the extension: the sizing's figure is the final one."""
    facts = parse_facts(_startup(16000, 54.7, "63.85")[:2])
    assert facts.kv_cache_bytes == int(54.7 * GiB)
    assert facts.settled_kv_bytes == int(54.7 * GiB)


def test_without_the_extensible_cache_the_old_lines_read_as_before() -> None:
    """0.34 with --no-enable-extensible-kv-cache (and every release before) logs the profile's figure
    and the tokens right after it: that figure is the final one."""
    facts = parse_facts([_line(AVAILABLE, "55.21"), PREFIX % ("kv_cache_utils.py", 1) + TOKENS % "1,033,792"])
    assert facts.kv_cache_bytes == int(55.21 * GiB)
    assert facts.settled_kv_bytes == int(55.21 * GiB)
    assert facts.tentative_kv_bytes is None and not facts.sized_after_warmup


def test_the_memory_parts_report_the_final_kv_cache() -> None:
    parts = parse_facts(_startup(17117, 58.51, "63.85")).memory_parts()
    assert parts["kv_cache"] == int(58.51 * GiB)


@pytest.mark.parametrize("where", [AVAILABLE, WARMUP, EXTENDED])
def test_the_format_strings_are_vllm_0_34s(where: tuple[str, int, str]) -> None:
    source = release_tree_or_skip("0.34.0", where[0]) / where[0]
    lines = source.read_text(encoding="utf-8").splitlines()
    # the format string starts at the cited line, as implicitly joined literals
    joined = ""
    for text in lines[where[1] - 1:where[1] + 6]:
        stripped = text.strip()
        if not stripped.startswith('"'):
            break
        joined += stripped.rstrip(",").strip('"')
    assert joined == where[2]
