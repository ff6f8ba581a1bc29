"""How kvwatch ends processes: SIGTERM, with SIGCONT so a stopped process can act on it, then SIGKILL
after a grace period. One policy for the three places that stop an engine: a process group
(spawn.stop_group), single processes (spawn.stop_each), and the reaper process
(kvwatch/watchdog/reaper.py), which imports this module alone to stay light (no psutil, no
subprocess): it is started once per engine and must work when kvwatch itself is gone."""
from __future__ import annotations

import signal
import time
from collections.abc import Callable


def escalate(send: Callable[[int], None], remaining: Callable[[], object], grace: float, *,
             kill_wait: float = 10.0, poll: float = 0.1, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep,
             before_kill: Callable[[], None] | None = None) -> bool:
    """End what `remaining()` reports: it is truthy (a non-empty list, True) while something is left.

    `send(sig)` delivers one signal to everything concerned (a group, a list of pids). SIGTERM then
    SIGCONT; up to `grace` seconds for everything to go; `before_kill()` (to log, say) and SIGKILL;
    up to `kill_wait` seconds more. True when nothing is left. Nothing is sent when nothing is left
    to begin with."""
    if not remaining():
        return True
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        if sig == signal.SIGKILL and before_kill is not None:
            before_kill()
        send(sig)
        if sig == signal.SIGTERM:
            send(signal.SIGCONT)
        deadline = clock() + wait
        while clock() < deadline:
            if not remaining():
                return True
            sleep(poll)
    return not remaining()
