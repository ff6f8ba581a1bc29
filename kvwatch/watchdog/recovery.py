"""After a failed launch: what was it, and what now (pure; the supervisor acts on the answer).

diagnosis_of() names the failure from how the launch ended and the engine's output; decide()
chooses, from the diagnosis, the command, the plans already tried, the budget and the policy,
whether to give up, restart the same plan or correct it (with which FlagChange), and returns
the records the state file keeps of it. Nothing here waits, spawns or writes: the supervisor's
state machine does, and takes the budget it was told is there.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.diagnosis import Diagnosis, FailureKind, GpuContext, diagnose, propose_remedy
from kvwatch.diagnosis.facts import BlockSizeFacts, facts_as
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import RuleSet
from kvwatch.policy import Policy, fixed_among
from kvwatch.watchdog.outcomes import LaunchOutcome
from kvwatch.watchdog.records import FAILURE, Constraint, CorrectionRecord, FailureRecord


class Action(enum.Enum):
    GIVE_UP = "give_up"       # FATAL, exit 78
    RESTART = "restart"       # the same plan again
    CORRECT = "correct"       # the corrected plan


@dataclass(frozen=True)
class BudgetState:
    """What the budget would refuse now: the reason, or None when there is room."""

    restart_refused: str | None = None
    correction_refused: str | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    kind: FailureKind                      # the failure class
    reason: str                            # for the state transition (FATAL's without "gave up: ")
    change: FlagChange = NO_CHANGE
    command: EngineCommand | None = None   # the command to launch next (None when giving up)
    remedy_reason: str = ""                # why this change (the remedy's own words)
    correction: CorrectionRecord | None = None
    constraint: Constraint | None = None   # what this host's engine taught


def diagnosis_of(outcome: LaunchOutcome, detail: str, lines: Sequence[str], served: bool) -> Diagnosis:
    """The failure of one launch: the engine's output names it; a hang or a silent start timeout
    is an engine that died; a spawn that failed ran nothing (fatal: nothing to correct)."""
    if outcome in (LaunchOutcome.EXIT, LaunchOutcome.START_TIMEOUT):
        diagnosis = diagnose(list(lines), served=served)
        if outcome is LaunchOutcome.START_TIMEOUT and diagnosis.kind == FailureKind.UNKNOWN:
            return Diagnosis(kind=FailureKind.ENGINE_DIED, evidence=detail, facts={}, fatal=False)
        return diagnosis
    if outcome is LaunchOutcome.HANG:
        return Diagnosis(kind=FailureKind.ENGINE_DIED, evidence=detail, facts={}, fatal=False)
    if outcome is LaunchOutcome.STALLED:   # no fault of the plan: restarted as it is
        return Diagnosis(kind=FailureKind.STALLED, evidence=detail, facts={}, fatal=False)
    return Diagnosis(kind=FailureKind.UNKNOWN, evidence=detail, facts={}, fatal=True)


def with_rank(diagnosis: Diagnosis, rank: int, pid: int) -> Diagnosis:
    """The diagnosis of an engine one of whose DP engine cores died first: named for that rank."""
    died = f"the engine core of data-parallel rank {rank} (EngineCore_DP{rank}, pid {pid}) died first"
    kind = diagnosis.kind
    if kind is FailureKind.UNKNOWN:
        kind = FailureKind.ENGINE_DIED
    evidence = f"{died}: {diagnosis.evidence}" if diagnosis.evidence else died
    return Diagnosis(kind, evidence, {**diagnosis.facts, "rank": rank, "rank_pid": pid}, diagnosis.fatal)


def kind_of(diagnosis: Diagnosis) -> FailureKind:
    return FailureKind(diagnosis.kind)


def failure_record(diagnosis: Diagnosis, detail: str, command: EngineCommand, now: float) -> FailureRecord:
    return FailureRecord(kind_of(diagnosis), diagnosis.evidence or detail, now, list(command.argv), detail)


def tried_plans(failures: Iterable[FailureRecord]) -> set[tuple[str, ...]]:
    """The commands that failed: never proposed again. A crash or a stall of a serving engine
    (ENGINE_DIED, STALLED) does not condemn its plan: that one is restarted, within the restart budget."""
    return {tuple(f.argv) for f in failures if f.kind not in (FailureKind.ENGINE_DIED, FailureKind.STALLED)}


def _held_back(diagnosis: Diagnosis, command: EngineCommand, policy: Policy, tried: set[tuple[str, ...]],
               plan: Plan | None, gpu: GpuContext | None, rules: RuleSet | None, chosen: object) -> str:
    """What policy.fixed_flags kept from being applied, in words ("" when nothing): the remedy
    kvwatch would have chosen without them."""
    if not policy.fixed_flags:
        return ""
    free = propose_remedy(diagnosis, command, policy=replace(policy, fixed_flags=()), tried=tried, plan=plan,
                          gpu=gpu, rules=rules)
    flags = fixed_among(policy, free.change.flags) if free is not None else ()
    if free is None or not flags:
        return ""
    what = "no remedy keeps" if chosen is None else "the next remedy that keeps"
    return (f"{what} policy.fixed_flags {', '.join(flags)}: {free.change.describe()} not applied "
            f"({free.reason})")


def decide(diagnosis: Diagnosis, command: EngineCommand, *, detail: str = "",
           tried: Iterable[tuple[str, ...]] = (), budget: BudgetState = BudgetState(),
           policy: Policy = Policy(), plan: Plan | None = None, gpu: GpuContext | None = None,
           rules: RuleSet | None = None, now: float = 0.0) -> Decision:
    """Give up, restart or correct; `now` (wall clock) stamps the correction record."""
    kind = kind_of(diagnosis)
    evidence = diagnosis.evidence or detail
    remedy = propose_remedy(diagnosis, command, policy=policy, tried=set(tried), plan=plan, gpu=gpu, rules=rules)
    held = _held_back(diagnosis, command, policy, set(tried), plan, gpu, rules, remedy)
    if remedy is None:
        return Decision(Action.GIVE_UP, kind, f"{kind}: {evidence} ({held or 'no remedy'})")
    corrected = remedy.apply(command)
    if corrected.argv == command.argv:
        if budget.restart_refused is not None:
            return Decision(Action.GIVE_UP, kind, f"{kind}: {budget.restart_refused}; last: {evidence}")
        return Decision(Action.RESTART, kind, f"{kind}: {remedy.reason}", command=command,
                        remedy_reason=remedy.reason)
    if budget.correction_refused is not None:
        return Decision(Action.GIVE_UP, kind, f"{kind}: {budget.correction_refused}; last: {evidence}")
    change = remedy.change
    if held:
        remedy = replace(remedy, reason=f"{remedy.reason} ({held})")
    return Decision(
        Action.CORRECT, kind, f"{kind}: corrected {change.describe()}", change=change, command=corrected,
        remedy_reason=remedy.reason,
        correction=CorrectionRecord(kind, change, remedy.reason, now, list(command.argv), list(corrected.argv)),
        constraint=Constraint(kind, evidence or "", change, FAILURE,
                              _backend_block_sizes(diagnosis)))


def _backend_block_sizes(diagnosis: Diagnosis) -> dict[str, list[Any]]:
    """The block sizes the engine's backends said they accept (kept as a constraint for the next plans)."""
    facts = facts_as(diagnosis.typed_facts, BlockSizeFacts)
    return {name: list(rules) for name, rules in facts.backend_block_sizes.items()}
