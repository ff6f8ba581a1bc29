"""FlagChange: the one flag-change type (planner fixes, remedies, preflight, state file records)."""
from __future__ import annotations

import json

import pytest

from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.watchdog.state_store import Constraint, EngineRecord, StateStore

SERVE = ("vllm", "serve", "m")


def test_describe_is_one_wording():
    change = FlagChange({"--block-size": 32, "--kv-cache-dtype": "auto"}, ("--attention-backend",))
    assert change.describe() == "--block-size 32, --kv-cache-dtype auto, remove --attention-backend"
    assert FlagChange().describe() == "nothing" and FlagChange().empty


def test_apply_sets_and_removes():
    command = EngineCommand(SERVE + ("--block-size", "16", "--attention-backend", "FLASH_ATTN"))
    out = FlagChange({"--block-size": 32}, ("--attention-backend",)).apply(command)
    assert out.argv == SERVE + ("--block-size", "32")


def test_json_round_trip_and_short_form():
    change = FlagChange({"--max-model-len": 1024}, ("--block-size",))
    assert change.to_json() == {"set": {"--max-model-len": 1024}, "remove": ["--block-size"]}
    assert FlagChange.from_json(json.loads(json.dumps(change.to_json()))) == change
    assert change.as_flags() == {"--max-model-len": 1024, "--block-size": None}
    assert FlagChange.from_flags(change.as_flags()) == change
    assert "--block-size" in change and "--max-model-len" in change and "--port" not in change
    assert hash(change) == hash(FlagChange({"--max-model-len": 1024}, ["--block-size"]))


def test_then_lets_the_later_change_decide():
    first = FlagChange({"--block-size": 32}, ("--attention-backend",))
    assert first.then(FlagChange(remove=("--block-size",))) == FlagChange(remove=("--block-size", "--attention-backend"))
    assert first.then(FlagChange({"--attention-backend": "TRITON_ATTN"})) == \
        FlagChange({"--block-size": 32, "--attention-backend": "TRITON_ATTN"})


@pytest.mark.parametrize("bad", [{"set": [1]}, {"set": {1: 2}}, {"remove": "--block-size"}, {"remove": [3]}])
def test_from_json_refuses_what_is_not_a_change(bad):
    with pytest.raises(ValueError):
        FlagChange.from_json(bad)


def test_old_state_file_is_read(tmp_path):
    """Before FlagChange, constraints wrote the flags they set as "fix"; the file is on users' disks."""
    old = {"version": 1, "name": "e", "argv": list(SERVE),
           "preflight": [{"kind": "block_size_unsupported", "message": "m", "set": {"--block-size": 64}, "remove": []}],
           "corrections": [{"kind": "config_refused", "set": {}, "remove": ["--block-size"], "reason": "r",
                            "time": 1.0, "from_argv": ["a"], "to_argv": ["b"]}],
           "constraints": [{"kind": "block_size_unsupported", "text": "t", "fix": {"--block-size": 64},
                            "source": "preflight"},
                           {"kind": "config_refused", "text": "t", "fix": {}, "remove": ["--block-size"],
                            "source": "failure", "backend_block_sizes": {"CPU_ATTN": ["MultipleOf(32)"]}}]}
    (tmp_path / "e.json").write_text(json.dumps(old))
    record = StateStore(tmp_path, "e").load()
    assert record is not None
    assert record.preflight[0].change == FlagChange({"--block-size": 64})
    assert record.corrections[0].change == FlagChange(remove=("--block-size",))
    assert [c.change for c in record.constraints] == [FlagChange({"--block-size": 64}),
                                                      FlagChange(remove=("--block-size",))]
    assert record.constraints[1].backend_block_sizes == {"CPU_ATTN": ["MultipleOf(32)"]}
    # Written back in the one form, and read again the same.
    data = record.to_json()
    assert data["constraints"][0] == {"kind": "block_size_unsupported", "text": "t", "set": {"--block-size": 64},
                                      "remove": [], "source": "preflight"}
    assert data["corrections"][0]["set"] == {} and data["corrections"][0]["remove"] == ["--block-size"]
    again = EngineRecord.from_json(json.loads(json.dumps(data)))
    assert again.constraints == record.constraints and again.corrections == record.corrections
    assert isinstance(again.constraints[0], Constraint)
