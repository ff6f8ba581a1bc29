"""One parser of the engine's KV cache startup lines, used by the output pump and the diagnosis alike."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.diagnosis import diagnose
from kvwatch.diagnosis.patterns import CONTEXT_PATTERNS
from kvwatch.diagnosis.startup_lines import KV_TOKENS, LogFacts, kv_tokens, parse_fact
from kvwatch.watchdog import output_pump

LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize("line,tokens", [
    ("(EngineCore pid=2) INFO [kv_cache_utils.py:1] GPU KV cache size: 1,398,080 tokens", 1_398_080),
    ("(EngineCore_DP0 pid=7) INFO CPU KV cache size: 2,097,152 tokens, maximum concurrency ...", 2_097_152),
    ("INFO GPU KV cache size: 17328 tokens", 17_328),
    ("INFO GPU KV cache usage: 12.5%", None),
    ("KV cache size: many tokens", None),
])
def test_kv_tokens(line: str, tokens: int | None) -> None:
    assert kv_tokens(line) == tokens
    assert parse_fact(line, LogFacts()).kv_tokens == tokens


def test_the_pump_and_the_diagnosis_share_the_parser() -> None:
    assert output_pump.parse_fact is parse_fact and output_pump.LogFacts is LogFacts
    assert [p for _, p, key, _ in CONTEXT_PATTERNS if key == "kv_cache_tokens"] == [KV_TOKENS]


@pytest.mark.parametrize("log", sorted(p.name for p in LOGS.glob("*.log") if "KV cache size:" in p.read_text()))
def test_both_read_the_same_figure_from_real_logs(log: str) -> None:
    lines = (LOGS / log).read_text(errors="replace").splitlines()
    facts = LogFacts()
    for line in lines:
        facts = parse_fact(line, facts)
    context = diagnose(lines).facts.get("context", {})
    assert facts.kv_tokens == next(t for line in lines if (t := kv_tokens(line)) is not None)
    assert context.get("kv_cache_tokens") == facts.kv_tokens
