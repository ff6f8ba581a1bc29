"""FlagChange: the one flag-change type (planner fixes, remedies, preflight, state file records)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import kvwatch
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import CHANGED_FLAGS, FlagChange
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


def _flags_built_in(tree: ast.Module) -> set[str]:
    """The flags the FlagChanges of one module touch: the "--..." literals inside a FlagChange(...)
    call, a name there resolved to the module's constant ("--x" or a tuple of them) or to the
    constant a for loop takes it from; and, where a function builds one from a variable, the
    "--..." keys it stores into a dict (change["--block-size"] = ...) or appends to a list. The
    planner's architecture refusals carry theirs as a dict literal, fix= or last. A name it cannot
    resolve fails the test: the set must never miss a flag that is built indirectly."""
    def literals(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n.value.startswith("--") and " " not in n.value}

    constants = {t.id: literals(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name) and literals(node.value)}

    def called(call: ast.Call) -> str:
        f = call.func
        return f.attr if isinstance(f, ast.Attribute) and f.attr == "from_flags" else getattr(f, "id", "")

    found: set[str] = set()
    for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
        loops = {n.target.id: n.iter for n in ast.walk(func) if isinstance(n, ast.For)
                 and isinstance(n.target, ast.Name)}
        calls = [c for c in ast.walk(func) if isinstance(c, ast.Call) and called(c) in ("FlagChange", "from_flags")]
        for call in calls:
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                if not isinstance(arg, (ast.Dict, ast.Tuple, ast.List)):
                    continue
                found |= literals(arg)
                keys = arg.keys if isinstance(arg, ast.Dict) else arg.elts
                for key in (k for k in keys if isinstance(k, ast.Name)):
                    source = loops.get(key.id)
                    resolved = constants.get(source.id) if isinstance(source, ast.Name) else constants.get(key.id)
                    assert resolved, f"FlagChange with a flag named {key.id!r}: resolve it here"
                    found |= resolved
        if any(isinstance(a, ast.Name) for c in calls for a in c.args):
            for n in ast.walk(func):
                if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store):
                    found |= literals(n.slice)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append":
                    found |= {f for a in n.args for f in literals(a)}
        for call in (c for c in ast.walk(func) if isinstance(c, ast.Call) and getattr(c.func, "id", "") ==
                     "ArchitectureRefusal"):
            found |= {f for a in [*call.args[2:], *(k.value for k in call.keywords if k.arg == "fix")]
                      if isinstance(a, ast.Dict) for f in literals(a)}
    return found


def test_changed_flags_are_exactly_the_flags_kvwatchs_changes_touch():
    # The set a persisted command may differ in (watchdog/persisted_command.py) is the code's own:
    # a new remedy's flag missing from it would make kvwatch refuse its own correction on restart,
    # a flag no change touches would let a forged state file change it.
    built: dict[str, set[str]] = {}
    for path in sorted(Path(kvwatch.__file__).parent.rglob("*.py")):
        if path.name == "flag_change.py":
            continue
        flags = _flags_built_in(ast.parse(path.read_text()))
        if flags:
            built[str(path.relative_to(Path(kvwatch.__file__).parent))] = flags
    assert {"diagnosis/remedies.py", "planner/pressure.py", "planner/plan.py"} <= set(built)
    assert set().union(*built.values()) == CHANGED_FLAGS, built
