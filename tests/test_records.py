"""The state file's records carry a FailureKind, and still read what earlier kvwatch versions wrote."""
from __future__ import annotations

import json

import pytest

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.flag_change import FlagChange
from kvwatch.watchdog.records import Constraint, CorrectionRecord, FailureRecord, PreflightFix


@pytest.mark.parametrize("written,kind", [
    ("cuda_oom", FailureKind.CUDA_OOM),
    ("engine_died", FailureKind.ENGINE_DIED),
    ("a_kind_from_a_newer_kvwatch", FailureKind.UNKNOWN),   # read, not refused
])
def test_every_record_reads_its_kind_as_a_failure_kind(written: str, kind: FailureKind) -> None:
    change = {"set": {"--block-size": "32"}, "remove": []}
    records = [
        FailureRecord.from_json({"kind": written, "evidence": None, "time": 1.0, "argv": ["vllm"]}),
        PreflightFix.from_json({"kind": written, "message": "m", **change}),
        CorrectionRecord.from_json({"kind": written, **change, "reason": "r", "time": 1.0, "from_argv": ["vllm"],
                                    "to_argv": ["vllm", "--block-size", "32"]}),
        Constraint.from_json({"kind": written, "text": "t", "fix": {"--block-size": "32"}}),  # the old "fix" form
    ]
    for record in records:
        assert record.kind is kind


def test_a_constraint_without_a_kind_reads_as_unknown_and_the_kinds_are_written_as_their_names() -> None:
    assert Constraint.from_json({"text": "t"}).kind is FailureKind.UNKNOWN
    change = FlagChange.from_json({"set": {"--block-size": "32"}})
    written = [PreflightFix(FailureKind.BLOCK_SIZE_UNSUPPORTED, "m", change).to_json(),
               CorrectionRecord(FailureKind.CUDA_OOM, change, "r", 1.0, ["a"], ["b"]).to_json(),
               Constraint(FailureKind.KV_CACHE_TOO_SMALL, "t", change).to_json()]
    assert [json.loads(json.dumps(w))["kind"] for w in written] == ["block_size_unsupported", "cuda_oom",
                                                                     "kv_cache_too_small"]
