"""The supervisor's status, as one immutable EngineStatus: what the exporter, systemd and the state
file's readers see. A pure read of the supervisor's parts; nothing here changes them."""
from __future__ import annotations

from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.plan import Plan
from kvwatch.vllm_releases.upgrade import planned_as
from kvwatch.watchdog.autopilot_controller import AutopilotController
from kvwatch.watchdog.engine_processes import EngineProcesses, Running
from kvwatch.watchdog.launch_evidence import LaunchEvidence
from kvwatch.watchdog.launch_memory import LaunchMemory
from kvwatch.watchdog.pressure_watch import PressureWatch
from kvwatch.watchdog.state_store import EngineRecord


def engine_status(name: str, state: EngineState, reason: str, plan: Plan | None, command: EngineCommand,
                  record: EngineRecord, running: Running | None, memory: LaunchMemory, pressure: PressureWatch,
                  ending: str | None, procs: EngineProcesses, evidence: LaunchEvidence,
                  autopilot: AutopilotController) -> EngineStatus:
    last = record.last_failure()
    trial = autopilot.trial
    return EngineStatus(
        name=name, state=state, reason=reason, plan=plan, argv=command.argv,
        pids=tuple(int(p["pid"]) for p in record.pids),
        pid_ranks=dict(running.tree.pid_ranks) if running is not None else {},
        restarts=dict(record.restarts), failures=dict(record.failure_counts),
        corrections=dict(record.correction_counts), last_failure=last.kind.value if last else None,
        log_kv_tokens=record.log_kv_tokens, log_available_kv_bytes=record.log_available_kv_bytes,
        log_memory_parts=dict(record.log_memory_parts), memory_requested_bytes=memory.requested,
        vllm_release=record.vllm_release, release_changes=memory.release_changes,
        vllm_release_planned_as=planned_as(record.vllm_release),
        recommendation=pressure.recommendation, ending=ending,
        escaped_processes=procs.escaped,
        autopilot=dict(record.autopilot_counts),
        gpu_release_waits=dict(evidence.release_waits),
        gpu_release_wait_seconds=evidence.last_release_wait,
        autopilot_trial=trial.change.describe() if trial is not None else None)
