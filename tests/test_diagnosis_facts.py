"""The typed facts (kvwatch/diagnosis/facts.py) read what the scanner reports, on every real log we hold.

For each class with typed facts: every typed field equals the scanner's JSON fact of that name, and
every field is filled by at least one real log (a field whose key is misspelled in `from_json` would
never be), and a fact of the wrong type reads as absent."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from kvwatch.diagnosis import Diagnosis, FailureKind
from kvwatch.diagnosis.diagnose import diagnose, diagnose_stream
from kvwatch.diagnosis.facts import (
    BackendFacts,
    BlockSizeFacts,
    ConfigRefusedFacts,
    CudaOomFacts,
    EngineContext,
    FailureFacts,
    KvTooSmallFacts,
    facts_as,
    facts_of,
)
from kvwatch.diagnosis.remedies import _OPTIONS

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LOGS = sorted((FIXTURES / "logs").glob("*.log")) + sorted((FIXTURES / "field_logs").glob("*.log"))
# Typed fields read from a JSON key of another name.
_KEY_OF = {"selector_block_size": ("selector_config", "block_size")}
# Fields no log we hold fills (wordings from vLLM's source only), each with a line that fills it.
_EXPECTED_EMPTY = {
    (BlockSizeFacts, "backends"): "ValueError: Aligned KV cache block size 48 is not supported by attention "
                                  "backend(s): FLASH_ATTN, TRITON_ATTN",
    (ConfigRefusedFacts, "model_max_length"): "  Value error, User-specified max_model_len (40000) is greater than "
                                              "the derived max_model_len (max_position_embeddings=32768 or "
                                              "model_max_length=36000 in model's config.json). [type=value_error]",
}


def _diagnoses() -> list[Diagnosis]:
    out = []
    for path in LOGS:
        with open(path, "rb") as stream:
            out.append(diagnose_stream(stream))
    return out


DIAGNOSES = _diagnoses()


def _json_value(facts: dict, name: str) -> object:
    if name in _KEY_OF:
        outer, inner = _KEY_OF[name]
        return (facts.get(outer) or {}).get(inner)
    return facts.get(name)


def _plain(value: object) -> object:
    """A value as JSON holds it: tables of lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _typed_fields(cls: type[FailureFacts]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.name not in ("context",)]


def test_every_class_with_a_flag_remedy_has_typed_facts() -> None:
    typed = {k for k in FailureKind if type(facts_of(k, {})) is not FailureFacts}
    # the classes whose only remedy is the same plan again need no facts
    assert typed == set(_OPTIONS) - {FailureKind.ENGINE_DIED, FailureKind.STALLED, FailureKind.NO_KV_CACHE_MEMORY,
                                     FailureKind.KILLED, FailureKind.UNKNOWN, FailureKind.PORT_IN_USE}


def test_typed_facts_equal_the_reported_ones_on_every_real_log() -> None:
    filled: set[tuple[type, str]] = set()
    for d in DIAGNOSES:
        typed = d.typed_facts
        for name in _typed_fields(type(typed)):
            value, reported = _plain(getattr(typed, name)), _plain(_json_value(d.facts, name))
            if value in ([], {}):
                value = None    # an empty list or table: not reported
            assert value == reported, (d.kind, name, value, reported)
            if value is not None:
                filled.add((type(typed), name))
        context = d.facts.get("context") or {}
        assert typed.context == EngineContext(context.get("block_size"), context.get("kv_cache_dtype"),
                                              context.get("attention_backend"))
    classes = {type(d.typed_facts) for d in DIAGNOSES} - {FailureFacts}
    never = {(cls, name) for cls in classes for name in _typed_fields(cls)} - filled - set(_EXPECTED_EMPTY)
    assert not never, sorted((c.__name__, n) for c, n in never)
    assert not filled & set(_EXPECTED_EMPTY), "a log fills it now: drop it from _EXPECTED_EMPTY"


@pytest.mark.parametrize(("cls", "name"), sorted(_EXPECTED_EMPTY, key=str))
def test_the_fields_no_log_fills_are_read_from_vllms_wording(cls: type[FailureFacts], name: str) -> None:
    d = diagnose(["ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.", _EXPECTED_EMPTY[(cls, name)]])
    assert isinstance(d.typed_facts, cls)
    assert _plain(getattr(d.typed_facts, name)) == _plain(d.facts[name]) not in (None, [])


@pytest.mark.parametrize(("kind", "facts", "field", "expected"), [
    (FailureKind.BLOCK_SIZE_UNSUPPORTED, {"block_size": "8"}, "block_size", None),          # a string, not a size
    (FailureKind.BLOCK_SIZE_UNSUPPORTED, {"block_size": True}, "block_size", None),
    (FailureKind.BLOCK_SIZE_UNSUPPORTED, {"backends": "FLASH_ATTN"}, "backends", ()),
    (FailureKind.KV_CACHE_TOO_SMALL, {"estimated_max_model_len": 2048.5}, "estimated_max_model_len", None),
    (FailureKind.CUDA_OOM, {"free_gib": 3}, "free_gib", 3.0),
    (FailureKind.NO_ATTENTION_BACKEND, {"selector_config": {"block_size": 8}}, "selector_block_size", 8),
    (FailureKind.NO_ATTENTION_BACKEND, {"reasons": {"A": ["x"], "B": "y"}}, "reasons", {"A": ("x",)}),
    (FailureKind.CONFIG_REFUSED, {"value": [1]}, "value", None),
])
def test_a_fact_of_the_wrong_type_reads_as_absent(kind: FailureKind, facts: dict, field: str,
                                                   expected: object) -> None:
    assert getattr(facts_of(kind, facts), field) == expected


def test_facts_of_another_class_read_as_that_class_empty() -> None:
    oom = facts_of(FailureKind.CUDA_OOM, {"phase": "model_load", "pattern": "model_load_oom"})
    assert isinstance(oom, CudaOomFacts) and oom.phase == "model_load"
    assert facts_as(oom, KvTooSmallFacts) == KvTooSmallFacts()
    assert facts_as(oom, BlockSizeFacts).backend_block_sizes == {}
    assert facts_as(facts_of(FailureKind.UNKNOWN, {"pattern": "x"}), BackendFacts).reasons == {}
