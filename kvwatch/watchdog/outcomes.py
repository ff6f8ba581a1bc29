"""How one launch of the engine ended, as the supervisor saw it (pure, and kept light: the supervisor
imports it at start, the recovery decision only when an engine fails)."""
from __future__ import annotations

import enum


class LaunchOutcome(enum.Enum):
    EXIT = "exit"                    # the engine exited (code in the LaunchEnd), or said it died after READY
    HANG = "hang"                    # /health failed for hang_timeout_seconds after READY
    STALLED = "stalled"              # /health answered, but no token came with requests running (stall_timeout)
    START_TIMEOUT = "start_timeout"  # not READY within start_timeout_seconds
    SPAWN_FAILED = "spawn_failed"    # the command could not be started at all
    STOP = "stop"                    # kvwatch was asked to stop
    AUTOPILOT = "autopilot"          # kvwatch relaunches it to apply a KV-pressure change or roll one back

