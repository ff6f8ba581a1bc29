"""`python -m kvwatch.watchdog.reaper PGID GRACE`: ends an engine's process group when kvwatch dies.

Why a separate process: PR_SET_PDEATHSIG only reaches the direct child (vLLM's API
server), and EngineCore and Worker survive the API server's death (docs/vllm-facts.md §9).
kvwatch starts one reaper per engine, in its own session (so neither a terminal's
Ctrl-C nor a signal to the engine's group reaches it), with the read end of a pipe as
stdin. kvwatch holds the only write end. When kvwatch exits for any reason, kill -9
included, the kernel closes that end and the reaper reads EOF: it sends SIGTERM (and
SIGCONT, for a stopped group) to the engine's group, then SIGKILL after GRACE seconds.
On a normal stop kvwatch writes "done" first and the reaper exits without a signal.
"""
from __future__ import annotations

import os
import signal
import sys

from kvwatch.boundary.escalation import escalate  # light: signal and time only (no psutil)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m kvwatch.watchdog.reaper PGID GRACE_SECONDS", file=sys.stderr)
        return 2
    pgid, grace = int(argv[0]), float(argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only kvwatch's death (EOF) or SIGKILL ends us
    message = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        message += chunk
        if b"done" in message:
            return 0
    # kvwatch is gone: its engine must not outlive it.
    escalate(lambda sig: _signal_group(pgid, sig), lambda: _group_alive(pgid), grace, kill_wait=0.0)
    print(f"kvwatch reaper: kvwatch died; ended engine process group {pgid}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
