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
from kvwatch.diagnosis.start_phase import phase_of
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import RuleSet
from kvwatch.policy import Policy, fixed_among
from kvwatch.watchdog.engine_ranks import lines_of_rank
from kvwatch.watchdog.launch_watch import LaunchEnd
from kvwatch.watchdog.outcomes import NO_KERNEL_RECORD, KernelRecord, LaunchOutcome, signal_of
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


# Classes that say an engine died without naming why: a signal or the kernel's record names it better.
_NO_CAUSE = frozenset({FailureKind.UNKNOWN, FailureKind.ENGINE_DIED})
_REPEAT_WINDOW_SECONDS = 3600.0     # host OOM kills further apart than this are not one pattern
_LAST_LINE_CHARS = 300


def diagnosis_of(outcome: LaunchOutcome, detail: str, lines: Sequence[str], served: bool, *,
                 returncode: int | None = None, kernel: KernelRecord = NO_KERNEL_RECORD,
                 earlier: Sequence[FailureRecord] = (), argv: Sequence[str] = (), now: float = 0.0,
                 signal_name: str = "") -> Diagnosis:
    """The failure of one launch. The engine's failure lines name it; when they name no cause, the kernel's
    OOM record or the signal that ended it does (a kill kvwatch did not send: it sends none before a
    launch ends); a hang or a silent start timeout is an engine that died; a spawn that failed ran
    nothing (fatal: nothing to correct). `earlier` (the state file's failures) counts repeated host OOM
    kills of `argv` in the same phase within the last hour; `signal_name` names -returncode (the boundary
    knows the host's signal names)."""
    if outcome in (LaunchOutcome.EXIT, LaunchOutcome.START_TIMEOUT):
        diagnosis = diagnose(list(lines), served=served)
        phase = phase_of(lines)
        if kernel.oom_kills > 0 and diagnosis.kind in _NO_CAUSE:
            return _host_oom(diagnosis, kernel, phase, earlier, argv, now)
        signal_no = signal_of(returncode) if outcome is LaunchOutcome.EXIT else None
        if signal_no is not None and (diagnosis.kind is FailureKind.UNKNOWN or not diagnosis.evidence):
            named = f"signal {signal_no} ({signal_name})" if signal_name else f"signal {signal_no}"
            return Diagnosis(FailureKind.KILLED, f"killed by {named} from outside while {phase}",
                             {**diagnosis.facts, "signal": signal_no, "signal_name": signal_name, "phase": phase},
                             fatal=False)
        if outcome is LaunchOutcome.START_TIMEOUT and diagnosis.kind == FailureKind.UNKNOWN:
            return Diagnosis(kind=FailureKind.ENGINE_DIED, evidence=detail, facts={"phase": phase}, fatal=False)
        if diagnosis.kind is FailureKind.UNKNOWN:   # said when kvwatch gives up on it: what it saw
            last = next((line.strip() for line in reversed(lines) if line.strip()), "")
            return replace(diagnosis, facts={**diagnosis.facts, "phase": phase, "last_line": last[:_LAST_LINE_CHARS]})
        return diagnosis
    if outcome is LaunchOutcome.HOST_MEMORY:   # kvwatch's own stop before the host wedged: no second try as is
        return _host_oom(diagnose(list(lines), served=served), kernel, phase_of(lines), earlier, argv, now,
                         evidence=detail, at_least=1)
    if outcome is LaunchOutcome.HANG:
        return Diagnosis(kind=FailureKind.ENGINE_DIED, evidence=detail, facts={}, fatal=False)
    if outcome is LaunchOutcome.STALLED:   # no fault of the plan: restarted as it is
        return Diagnosis(kind=FailureKind.STALLED, evidence=detail, facts={}, fatal=False)
    return Diagnosis(kind=FailureKind.UNKNOWN, evidence=detail, facts={}, fatal=True)


def _host_oom(diagnosis: Diagnosis, kernel: KernelRecord, phase: str, earlier: Sequence[FailureRecord],
              argv: Sequence[str], now: float, evidence: str = "", at_least: int = 0) -> Diagnosis:
    """A host OOM: by the kernel's OOM killer, or kvwatch's stop before the host wedged (`evidence` given,
    counted as a repeat at once: a wedged host is no chance to retry as is)."""
    repeats = max(at_least, host_oom_repeats(earlier, phase, argv, now))
    evidence = evidence or f"the kernel's OOM killer ended the engine while {phase} ({kernel.where or 'its cgroup'})"
    if kernel.host_memory:
        evidence += f"; host memory: {kernel.host_memory}"
    facts: dict[str, Any] = {"phase": phase, "repeats": repeats, "oom_kills": kernel.oom_kills}
    if kernel.host_memory_bytes is not None:
        facts["host_memory_bytes"] = kernel.host_memory_bytes
    if diagnosis.evidence:
        facts["engine_line"] = diagnosis.evidence[:_LAST_LINE_CHARS]
    return Diagnosis(FailureKind.HOST_OOM, evidence, facts, fatal=False)


def host_oom_repeats(earlier: Sequence[FailureRecord], phase: str, argv: Sequence[str], now: float) -> int:
    """Earlier host OOM failures of `argv` in `phase` within the last hour: a pattern, not a mishap."""
    return sum(1 for f in earlier if f.kind is FailureKind.HOST_OOM and f.phase == phase
               and list(f.argv) == list(argv) and now - f.time <= _REPEAT_WINDOW_SECONDS)


def with_rank(diagnosis: Diagnosis, rank: int, pid: int) -> Diagnosis:
    """The diagnosis of an engine one of whose DP engine cores died first: named for that rank."""
    died = f"the engine core of data-parallel rank {rank} (EngineCore_DP{rank}, pid {pid}) died first"
    kind = diagnosis.kind
    said = diagnosis.evidence
    if kind is FailureKind.KILLED:   # the API server's own end followed the core's death: not the cause
        kind, said = FailureKind.ENGINE_DIED, None
    if kind is FailureKind.UNKNOWN:
        kind = FailureKind.ENGINE_DIED
    evidence = f"{died}: {said}" if said else died
    return Diagnosis(kind, evidence, {**diagnosis.facts, "rank": rank, "rank_pid": pid}, diagnosis.fatal)


# How a launch ended that the kernel may have recorded (an OOM kill): read its record then.
KERNEL_RECORDED = frozenset({LaunchOutcome.EXIT, LaunchOutcome.START_TIMEOUT, LaunchOutcome.HOST_MEMORY})


def launch_failure(end: LaunchEnd, lines: list[str], lost: tuple[int, int] | None, kernel: KernelRecord,
                   earlier: Sequence[FailureRecord], command: EngineCommand, now: float,
                   signal_name: str = "") -> tuple[Diagnosis, FailureRecord]:
    """The diagnosis of an ended launch and the state file's record of it. `lost`: the DP rank (and pid)
    whose engine core died first, diagnosed by its own lines and named for it."""
    if lost is not None:
        lines = lines_of_rank(lines, lost[0])
    diagnosis = diagnosis_of(end.outcome, end.detail, lines, end.served, returncode=end.returncode,
                             signal_name=signal_name, kernel=kernel, earlier=earlier, argv=command.argv, now=now)
    if lost is not None:
        diagnosis = with_rank(diagnosis, *lost)
    return diagnosis, replace(failure_record(diagnosis, end.detail, command, now), stacks=end.stacks)


def port_verdict(diagnosis: Diagnosis, port: int, listeners: Sequence[int | None]) -> Diagnosis:
    """An engine that could not bind its port: fatal while a process listens on it (kvwatch does not
    move the engine's port; the holder is named), restarted when nothing does any more. The port
    was taken for a moment then: a holder that has since gone, or an outgoing connection given it
    as its local port by the kernel."""
    if listeners:
        holders = ", ".join("a process kvwatch cannot see" if pid is None else f"pid {pid}" for pid in listeners)
        return replace(diagnosis, evidence=f"{diagnosis.evidence}; port {port} is held by {holders}", fatal=True)
    said = f"nothing listens on port {port} any more: it was taken only for a moment"
    return replace(diagnosis, evidence=f"{diagnosis.evidence}; {said}", fatal=False,
                   facts={**diagnosis.facts, "port": port, "port_free_again": True})


def kind_of(diagnosis: Diagnosis) -> FailureKind:
    return FailureKind(diagnosis.kind)


def failure_record(diagnosis: Diagnosis, detail: str, command: EngineCommand, now: float) -> FailureRecord:
    phase = diagnosis.facts.get("phase")
    return FailureRecord(kind_of(diagnosis), diagnosis.evidence or detail, now, list(command.argv), detail,
                         phase if isinstance(phase, str) else "")


# Failures that say nothing against the plan: a crash, a stall, a kill from outside, an exit no failure line
# names, the kernel's OOM killer (host memory, not the plan's GPU figures), a port taken for a moment.
# Their plan is restarted.
_PLAN_NOT_CONDEMNED = frozenset({FailureKind.ENGINE_DIED, FailureKind.STALLED, FailureKind.KILLED,
                                 FailureKind.UNKNOWN, FailureKind.HOST_OOM, FailureKind.PORT_IN_USE})


def tried_plans(failures: Iterable[FailureRecord]) -> set[tuple[str, ...]]:
    """The commands that failed: never proposed again. A crash of any kind that names nothing against the
    plan (_PLAN_NOT_CONDEMNED) does not condemn it: that one is restarted, within the restart budget."""
    return {tuple(f.argv) for f in failures if f.kind not in _PLAN_NOT_CONDEMNED}


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
        return Decision(Action.GIVE_UP, kind, f"{kind}: {evidence}{_seen(diagnosis)} ({held or 'no remedy'})")
    corrected = remedy.apply(command)
    if corrected.argv == command.argv:
        if budget.restart_refused is not None:
            return Decision(Action.GIVE_UP, kind, f"{kind}: {budget.restart_refused}; last: {evidence}{_seen(diagnosis)}")
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


def _seen(diagnosis: Diagnosis) -> str:
    """What kvwatch saw of an exit it could not name: the phase and the engine's last line."""
    if diagnosis.kind is not FailureKind.UNKNOWN or "phase" not in diagnosis.facts:
        return ""
    phase, last = diagnosis.facts.get("phase"), diagnosis.facts.get("last_line")
    said = f" while {phase}" if phase else ""
    if not last:
        return f"{said}; the engine printed nothing"
    return f"{said}; no failure line in its output; the engine's last line: {last}"


def _backend_block_sizes(diagnosis: Diagnosis) -> dict[str, list[Any]]:
    """The block sizes the engine's backends said they accept (kept as a constraint for the next plans)."""
    facts = facts_as(diagnosis.typed_facts, BlockSizeFacts)
    return {name: list(rules) for name, rules in facts.backend_block_sizes.items()}
