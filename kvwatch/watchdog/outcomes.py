"""How one launch of the engine ended, as the supervisor saw it (pure, and kept light: the supervisor
imports it at start, the recovery decision only when an engine fails)."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class LaunchOutcome(enum.Enum):
    EXIT = "exit"                    # the engine exited (code in the LaunchEnd), or said it died after READY
    HANG = "hang"                    # /health failed for hang_timeout_seconds after READY
    STALLED = "stalled"              # /health answered, but no token came with requests running (stall_timeout)
    START_TIMEOUT = "start_timeout"  # not READY within start_timeout_seconds
    SPAWN_FAILED = "spawn_failed"    # the command could not be started at all
    STOP = "stop"                    # kvwatch was asked to stop
    AUTOPILOT = "autopilot"          # kvwatch relaunches it to apply a KV-pressure change or roll one back
    HOST_MEMORY = "host_memory"      # kvwatch stopped it before host memory wedged the host (unified memory)



_MAX_SIGNAL = 64   # SIGRTMAX on Linux


def signal_of(returncode: int | None) -> int | None:
    """The signal that ended a process, from its Popen returncode: -N, or 128+N as `sh -c`, a container
    runtime and the image's vllm shim report a child's death by signal N; None for an exit of its own."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    return returncode - 128 if 128 < returncode <= 128 + _MAX_SIGNAL else None


@dataclass(frozen=True)
class KernelRecord:
    """What the kernel recorded while a launch ran (the watchdog reads it before and after): OOM kills in
    the engine's cgroup, and the memory the host and that cgroup hold, for the words of a host OOM."""

    oom_kills: int = 0                      # OOM kills the engine's cgroup counted during the launch
    where: str = ""                         # the cgroup and its counter, in words
    host_memory_bytes: int | None = None    # the host's memory, or the cgroup's limit where lower
    host_memory: str = ""                   # both, in words


NO_KERNEL_RECORD = KernelRecord()
