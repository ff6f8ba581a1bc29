"""What the supervisor knows about one engine, handed to the exporter as an immutable value."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kvwatch.planner.plan import Plan
from kvwatch.planner.pressure import Recommendation


class EngineState(str, Enum):
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FATAL = "fatal"


@dataclass(frozen=True)
class EngineStatus:
    name: str
    state: EngineState
    reason: str = ""                                   # why the last transition happened
    plan: Plan | None = None                           # the plan in force
    argv: tuple[str, ...] = ()                         # the command in force
    pids: tuple[int, ...] = ()                         # the engine's process tree, root first
    pid_ranks: dict[int, int] = field(default_factory=dict)    # pid -> data-parallel rank (cores and workers)
    restarts: dict[str, int] = field(default_factory=dict)     # by failure class
    failures: dict[str, int] = field(default_factory=dict)     # by failure class
    corrections: dict[str, int] = field(default_factory=dict)  # by failure class
    last_failure: str | None = None
    log_kv_tokens: int | None = None                   # "KV cache size: N tokens" from the log
    log_available_kv_bytes: int | None = None          # "Available KV cache memory: X GiB"
    log_memory_parts: dict[str, int] = field(default_factory=dict)   # one GPU's memory by part, as logged
    memory_requested_bytes: int | None = None          # card total x --gpu-memory-utilization (CUDA only)
    vllm_release: str | None = None                    # the engine's vLLM release (installed)
    vllm_release_planned_as: str | None = None         # the known release its facts come from
    release_changes: int = 0                           # release changes this kvwatch saw (state file)
    escaped_processes: int = 0                         # looked like the engine's at the last stop, not provably
    log_lines_dropped: int = 0                         # engine lines kvwatch's own stdout could not take
    recommendation: Recommendation | None = None       # one flag change for KV pressure (planner/pressure.py)
    autopilot: dict[str, int] = field(default_factory=dict)   # [autopilot] changes: applied, kept, rolled_back
    autopilot_trial: str | None = None                 # the change being measured (describe())
    # The waits before a relaunch for the dead engine's GPU memory (watchdog/gpu_release.py), by
    # outcome (released, timed_out, unavailable, cancelled), and how long the last one took.
    gpu_release_waits: dict[str, int] = field(default_factory=dict)
    gpu_release_wait_seconds: float | None = None
    ending: str | None = None                          # the launch ended (a hang, a stall): its engine is being
    #                                                    stopped and serves nothing, whatever the state says
