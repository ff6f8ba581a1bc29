"""Real failure logs from public threads (tests/fixtures/field_logs, index.json names the source of each):
each named as the class the index says, its evidence the root cause's line, its correction the one given,
and a failure outside kvwatch's vocabulary never corrected by a flag."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from kvwatch.diagnosis import FailureKind, propose_remedy
from kvwatch.diagnosis.diagnose import diagnose_stream
from kvwatch.failure_kinds import ALWAYS_FATAL
from kvwatch.planner.engine_args import EngineCommand

HERE = Path(__file__).resolve().parent / "fixtures" / "field_logs"
INDEX = json.loads((HERE / "index.json").read_text())["logs"]
BASE = ("vllm", "serve", "some/model")


def diagnosis_of(entry: dict):
    with open(HERE / entry["file"], "rb") as stream:
        return diagnose_stream(stream)


# The corrections in index.json were worked out for 0.33's semantics, the newest before 0.34, whose unset
# --gpu-memory-utilization means 1.0 (an extensible cache) where every earlier release's meant 0.9.
REMEDY_RELEASE = "0.33.0"


def remedy_of(entry: dict, d):
    command = EngineCommand.parse([*BASE, *entry.get("command", [])], REMEDY_RELEASE)
    return propose_remedy(d, command, tried=(command.argv,))


def test_the_corpus_is_big_enough_and_covers_every_class_twice_or_says_which_not():
    assert len(INDEX) >= 40
    assert all(entry["url"].startswith("https://github.com/") for entry in INDEX)
    counts = Counter(entry["kind"] for entry in INDEX if not entry.get("known_miss"))
    from kvwatch.failure_kinds import MEASURED
    assert set(counts) == {k.value for k in FailureKind if k not in MEASURED}
    assert min(counts.values()) >= 2, counts
    held_out = [e for e in INDEX if e.get("held_out")]
    assert len(held_out) * 4 >= len(INDEX), "at least a quarter of the corpus was held out"


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_field_log_is_named_with_its_root_cause(entry):
    d = diagnosis_of(entry)
    if entry.get("known_miss"):       # reported as a miss: it must not be named wrongly either
        remedy = remedy_of(entry, d)   # restarted as it is at most: never a flag change
        assert d.kind is FailureKind.UNKNOWN and (remedy is None or remedy.same_plan)
        return
    assert d.kind.value == entry["kind"], (d.kind, d.evidence)
    if entry.get("evidence"):
        assert entry["evidence"] in (d.evidence or ""), d.evidence
    if d.kind in ALWAYS_FATAL or entry.get("fatal"):
        assert d.fatal and d.facts.get("help"), d.facts


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_field_log_correction(entry):
    d = diagnosis_of(entry)
    remedy = remedy_of(entry, d)
    if "correction" in entry or "remove" in entry:
        assert remedy is not None and dict(remedy.change.set) == entry.get("correction", {}), remedy
        assert list(remedy.change.remove) == entry.get("remove", []), remedy
    elif d.fatal:
        assert remedy is None, remedy
    elif d.kind is FailureKind.UNKNOWN:   # a crash is a restart: the same plan, never a flag change
        assert remedy is not None and remedy.same_plan, remedy


def test_no_failure_outside_the_vocabulary_gets_a_flag_change():
    outside = [e for e in INDEX if e["kind"] == "unknown"]
    assert len(outside) >= 3
    for entry in outside:
        d = diagnosis_of(entry)
        remedy = remedy_of(entry, d)
        assert d.kind is FailureKind.UNKNOWN and (remedy is None or remedy.same_plan), entry["file"]


@pytest.mark.parametrize("entry", [e for e in INDEX if e["kind"] in {k.value for k in ALWAYS_FATAL}],
                         ids=lambda e: e["file"])
def test_the_watchdog_gives_up_at_once_on_a_fatal_class(entry):
    from kvwatch.watchdog import outcomes, recovery
    with open(HERE / entry["file"], encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    d = recovery.diagnosis_of(outcomes.LaunchOutcome.EXIT, "exit 1", lines, served=False)
    decision = recovery.decide(d, EngineCommand.parse(list(BASE)), budget=recovery.BudgetState())
    assert decision.action is recovery.Action.GIVE_UP and decision.command is None, decision
    assert entry["evidence"] in decision.reason


def test_the_watchdog_corrects_a_lora_rank():
    from kvwatch.watchdog import outcomes, recovery
    lines = (HERE / "lora_rank_llamafactory.log").read_text().splitlines()
    d = recovery.diagnosis_of(outcomes.LaunchOutcome.EXIT, "exit 1", lines, served=False)
    decision = recovery.decide(d, EngineCommand.parse([*BASE, "--enable-lora"]))
    assert decision.action is recovery.Action.CORRECT
    assert decision.command is not None and decision.command.argv[-2:] == ("--max-lora-rank", "32")


def test_an_nccl_error_of_a_serving_engine_is_a_death_to_restart():
    from kvwatch.diagnosis.diagnose import diagnose
    lines = (HERE / "nccl_system_error_019.log").read_text().splitlines()
    assert diagnose(lines).kind is FailureKind.NCCL_ERROR
    served = diagnose(lines, served=True)
    assert served.kind is FailureKind.ENGINE_DIED and not served.fatal
