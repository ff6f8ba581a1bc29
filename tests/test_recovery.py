"""Recovery decisions after a failed launch (kvwatch/watchdog/recovery.py), as a table: no child
processes, no clock, no files."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.diagnosis import SAME_PLAN_REASON, Diagnosis, FailureKind
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.policy import Policy
from kvwatch.watchdog import recovery
from kvwatch.watchdog.outcomes import LaunchOutcome
from kvwatch.watchdog.records import FailureRecord
from kvwatch.watchdog.recovery import Action, BudgetState

SERVE = ("vllm", "serve", "m")
BLOCK_16 = SERVE + ("--block-size", "16")
BLOCK_32 = SERVE + ("--block-size", "32")


def failed(kind: FailureKind, facts: dict | None = None, fatal: bool = False) -> Diagnosis:
    return Diagnosis(kind, f"{kind.value} evidence", facts or {}, fatal)


BLOCK_FAILURE = failed(FailureKind.BLOCK_SIZE_UNSUPPORTED,
                       {"block_size": 16, "backend_block_sizes": {"CPU_ATTN": ["MultipleOf(32)"]}})

CASES = [
    # (id, diagnosis, argv, decide() keywords, action, next argv (None: no launch), reason contains)
    ("an unknown failure is restarted as it is", failed(FailureKind.UNKNOWN), SERVE, {},
     Action.RESTART, SERVE, "no failure line names a cause"),
    ("an unknown failure past the restart budget gives up", failed(FailureKind.UNKNOWN), SERVE,
     {"budget": BudgetState(restart_refused="3 restarts within 600s (policy.max_restarts)")},
     Action.GIVE_UP, None, "unknown: 3 restarts within 600s (policy.max_restarts); last: unknown evidence"),
    ("fatal class exits", failed(FailureKind.BLOCK_SIZE_UNSUPPORTED, {"block_size": 16}, fatal=True), BLOCK_16, {},
     Action.GIVE_UP, None, "(no remedy)"),
    ("spawn failed: fatal", recovery.diagnosis_of(LaunchOutcome.SPAWN_FAILED, "cannot start vllm: No such file", [], False),
     SERVE, {}, Action.GIVE_UP, None, "unknown: cannot start vllm: No such file (no remedy)"),
    ("block size corrected", BLOCK_FAILURE, BLOCK_16, {},
     Action.CORRECT, BLOCK_32, "block_size_unsupported: corrected --block-size 32"),
    ("never the same failing plan twice", BLOCK_FAILURE, BLOCK_16, {"tried": {BLOCK_16, BLOCK_32}},
     Action.CORRECT, SERVE, "corrected remove --block-size"),
    ("every plan tried", BLOCK_FAILURE, BLOCK_16, {"tried": {BLOCK_16, BLOCK_32, SERVE}},
     Action.GIVE_UP, None, "(no remedy)"),
    ("policy switch forbids the change", BLOCK_FAILURE, BLOCK_16,
     {"policy": Policy(allow_block_size_change=False)}, Action.GIVE_UP, None, "(no remedy)"),
    ("correction budget exhausted", BLOCK_FAILURE, BLOCK_16,
     {"budget": BudgetState(correction_refused="5 corrections already (policy.max_corrections)")},
     Action.GIVE_UP, None, "block_size_unsupported: 5 corrections already (policy.max_corrections); last: "
                           "block_size_unsupported evidence"),
    ("engine_died restarts the same plan", failed(FailureKind.ENGINE_DIED), BLOCK_16, {"tried": {BLOCK_16}},
     Action.RESTART, BLOCK_16, f"engine_died: {SAME_PLAN_REASON}"),
    ("restart budget exhausted", failed(FailureKind.ENGINE_DIED), SERVE,
     {"budget": BudgetState(restart_refused="3 restarts within 600s (policy.max_restarts)")},
     Action.GIVE_UP, None, "engine_died: 3 restarts within 600s (policy.max_restarts); last: engine_died evidence"),
    ("a restart ignores the correction budget", failed(FailureKind.ENGINE_DIED), SERVE,
     {"budget": BudgetState(correction_refused="no more")}, Action.RESTART, SERVE, SAME_PLAN_REASON),
    ("a correction ignores the restart budget", BLOCK_FAILURE, BLOCK_16,
     {"budget": BudgetState(restart_refused="no more")}, Action.CORRECT, BLOCK_32, "corrected"),
    ("a hang is an engine that died", recovery.diagnosis_of(LaunchOutcome.HANG, "/health failed for 60s", [], True),
     SERVE, {}, Action.RESTART, SERVE, SAME_PLAN_REASON),
    ("a silent start timeout is an engine that died",
     recovery.diagnosis_of(LaunchOutcome.START_TIMEOUT, "not ready after 600s", ["loading weights"], False),
     SERVE, {}, Action.RESTART, SERVE, SAME_PLAN_REASON),
]


@pytest.mark.parametrize("diagnosis,argv,keywords,action,next_argv,reason",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision(diagnosis, argv, keywords, action, next_argv, reason):
    decision = recovery.decide(diagnosis, EngineCommand(argv), now=123.0, **keywords)
    assert decision.action is action
    assert reason in decision.reason
    assert (decision.command.argv if decision.command is not None else None) == next_argv
    assert decision.command is None or decision.command.argv not in keywords.get("tried", set()) \
        or action is Action.RESTART
    if action is Action.CORRECT:
        assert decision.correction is not None and decision.constraint is not None
        assert decision.correction.from_argv == list(argv) and decision.correction.to_argv == list(next_argv)
        assert decision.correction.change == decision.change == decision.constraint.change
        assert decision.correction.time == 123.0 and decision.constraint.source == "failure"
    else:
        assert decision.correction is None and decision.constraint is None
        assert decision.change == FlagChange()


def test_constraint_keeps_the_block_sizes_the_engine_reported():
    decision = recovery.decide(BLOCK_FAILURE, EngineCommand(BLOCK_16))
    assert decision.constraint is not None
    assert decision.constraint.backend_block_sizes == {"CPU_ATTN": ["MultipleOf(32)"]}
    assert decision.constraint.text == "block_size_unsupported evidence"


def test_tried_plans_spare_a_serving_engine_that_died():
    failures = [FailureRecord(FailureKind.BLOCK_SIZE_UNSUPPORTED, "e", 0.0, list(BLOCK_16)),
                FailureRecord(FailureKind.ENGINE_DIED, "e", 1.0, list(BLOCK_32))]
    assert recovery.tried_plans(failures) == {BLOCK_16}


def test_failure_record_falls_back_to_the_detail():
    diagnosis = Diagnosis(FailureKind.ENGINE_DIED, None, {}, False)
    record = recovery.failure_record(diagnosis, "exited with code 1", EngineCommand(SERVE), 5.0)
    assert (record.kind, record.evidence, record.argv, record.reason, record.time) == \
        ("engine_died", "exited with code 1", list(SERVE), "exited with code 1", 5.0)


def test_rank_names_the_failure():
    diagnosis = recovery.with_rank(failed(FailureKind.UNKNOWN), 1, 4242)
    assert diagnosis.kind is FailureKind.ENGINE_DIED and diagnosis.facts["rank"] == 1
    assert diagnosis.evidence.startswith("the engine core of data-parallel rank 1 (EngineCore_DP1, pid 4242)")


BLOCK_8_LOG = (Path(__file__).resolve().parent / "fixtures" / "logs" / "cpu_block_size_8.log").read_text().splitlines()


@pytest.mark.parametrize("outcome,lines,served,kind,fatal", [
    (LaunchOutcome.EXIT, BLOCK_8_LOG, False, FailureKind.BLOCK_SIZE_UNSUPPORTED, False),   # its log names it
    (LaunchOutcome.EXIT, ["bye"], False, FailureKind.UNKNOWN, False),
    (LaunchOutcome.EXIT, ["INFO Starting vLLM API server 0 on http://0.0.0.0:8000"], False,
     FailureKind.ENGINE_DIED, False),   # it served, though kvwatch's probe had not seen it yet
    (LaunchOutcome.START_TIMEOUT, BLOCK_8_LOG, False, FailureKind.BLOCK_SIZE_UNSUPPORTED, False),
    (LaunchOutcome.START_TIMEOUT, ["loading weights"], False, FailureKind.ENGINE_DIED, False),
    (LaunchOutcome.HANG, BLOCK_8_LOG, True, FailureKind.ENGINE_DIED, False),   # a hang: whatever it logged before
    (LaunchOutcome.SPAWN_FAILED, [], False, FailureKind.UNKNOWN, True),        # nothing ran: nothing to correct
])
def test_the_diagnosis_of_every_way_a_launch_ends(outcome: LaunchOutcome, lines: list[str], served: bool,
                                                  kind: FailureKind, fatal: bool) -> None:
    diagnosis = recovery.diagnosis_of(outcome, "detail", lines, served)
    assert (diagnosis.kind, diagnosis.fatal) == (kind, fatal)


def test_a_dp_rank_that_died_first_names_the_diagnosis() -> None:
    ranked = recovery.with_rank(failed(FailureKind.UNKNOWN), 2, 4321)
    assert ranked.kind is FailureKind.ENGINE_DIED
    assert ranked.evidence is not None and ranked.evidence.startswith("the engine core of data-parallel rank 2")
    assert (ranked.facts["rank"], ranked.facts["rank_pid"]) == (2, 4321)
    record = recovery.failure_record(ranked, "exited with code 1", EngineCommand(SERVE), 5.0)
    assert (record.kind, record.time, record.argv, record.reason) == (FailureKind.ENGINE_DIED, 5.0, list(SERVE),
                                                                      "exited with code 1")


def test_a_dp_rank_that_died_first_is_the_cause_not_the_api_servers_signal() -> None:
    killed = Diagnosis(FailureKind.KILLED, "killed by signal 9 (SIGKILL) from outside while serving",
                       {"signal": 9}, False)
    ranked = recovery.with_rank(killed, 1, 4321)
    assert ranked.kind is FailureKind.ENGINE_DIED
    assert ranked.evidence == "the engine core of data-parallel rank 1 (EngineCore_DP1, pid 4321) died first"
