"""Who ended the engine: the kernel's OOM killer or a signal from outside, from the cgroup's OOM-kill
count read before the launch and after the death (pure).

The count is the kernel's own record (cgroup v2 ``memory.events`` ``oom_kill``, v1
``memory.oom_control`` ``oom_kill``; ``kvwatch/boundary/oom_record.py`` reads it). It counts every
OOM kill of a process in the cgroup, the host-wide OOM killer's too, so a count that moved during the
launch names the OOM killer even when the process that died of it was one of the engine's workers and
the API server exited with a code of its own. A count that did not move, or none to read, leaves "a
signal from outside": kvwatch only asks about signals it did not send.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from kvwatch.values.host_memory import HostMemory, OomCount
from kvwatch.watchdog.outcomes import KernelRecord, signal_of

# Linux numbers (x86-64 and arm64 alike); the pure core does not import `signal`.
_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
                 9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


class Killer(str, enum.Enum):
    OOM_KILLER = "oom_killer"  # the cgroup's OOM-kill count moved during the launch
    SIGNAL = "signal"          # a signal, and the count did not move (or there was none to read)
    NONE = "none"              # the engine exited with a code, and no OOM kill was counted


@dataclass(frozen=True)
class KillCause:
    killer: Killer
    signal: int | None                   # the signal that ended the engine, if one did
    text: str                            # for the failure record and the log
    oom_kills: tuple[int, int] | None    # the count before and after, when both could be read alike


def signal_name(signum: int) -> str:
    return _SIGNAL_NAMES.get(signum, f"signal {signum}")


def split_returncode(returncode: int) -> tuple[int | None, int | None]:
    """(signal, exit code) from a Popen returncode: negative is the signal that ended the process."""
    return (-returncode, None) if returncode < 0 else (None, returncode)


def _comparable(before: OomCount | None, after: OomCount | None) -> tuple[int, int] | None:
    """Both reads of the same cgroup, the count not gone backwards (a cgroup removed and made again)."""
    if before is None or after is None:
        return None
    if (before.cgroup, before.version) != (after.cgroup, after.version) or after.oom_kill < before.oom_kill:
        return None
    return before.oom_kill, after.oom_kill


def _how_it_ended(signal: int | None, exit_code: int | None) -> tuple[int | None, str]:
    """The signal (a shell's 128+N exit code read as signal N) and the words for the end."""
    if signal is not None:
        return signal, f"killed by signal {signal}"
    if (from_code := signal_of(exit_code)) is not None:   # 128+N: a shell's or a runtime's report of signal N
        return from_code, f"killed by signal {from_code} (exit code {exit_code})"
    return None, f"exited with code {exit_code}" if exit_code is not None else "ended, how unknown"


def kill_cause(before: OomCount | None, after: OomCount | None, signal: int | None,
               exit_code: int | None) -> KillCause:
    """Name who ended a launch. `before` is read before the launch, `after` once the engine is dead
    (None: no memory cgroup, or it could not be read); `signal` or `exit_code` as the engine's root
    process ended (split_returncode). Call it for an end kvwatch did not cause."""
    counts = _comparable(before, after)
    signum, ended = _how_it_ended(signal, exit_code)
    if counts is not None and counts[1] > counts[0] and after is not None:
        record = f"cgroup {after.cgroup}, oom_kill {counts[0]}→{counts[1]}"
        if before is not None and before.oom_group_kill is not None and after.oom_group_kill is not None \
                and after.oom_group_kill > before.oom_group_kill:
            record += f", oom_group_kill {before.oom_group_kill}→{after.oom_group_kill}"
        if signum == 9:
            text = f"killed by the kernel's OOM killer ({record})"
        else:  # the OOM killer sends SIGKILL: the root died of something else, one of its processes of this
            how = f"{ended} from outside" if signum is not None else ended
            text = f"{how}; a process of the engine was killed by the kernel's OOM killer ({record})"
        return KillCause(Killer.OOM_KILLER, signum, text, counts)
    if signum is None:
        return KillCause(Killer.NONE, None, ended, counts)
    text = f"{ended} from outside ({signal_name(signum)}; "
    if counts is not None and after is not None:
        text += f"not the kernel's OOM killer: cgroup {after.cgroup} oom_kill stayed {counts[1]})"
    else:
        text += "no cgroup OOM-kill count to tell whether it was the kernel's OOM killer)"
    return KillCause(Killer.SIGNAL, signum, text, counts)


def kernel_record(before: OomCount | None, after: OomCount | None, host: HostMemory | None) -> KernelRecord:
    """The recovery's KernelRecord (outcomes.py) from the counts read before and after a launch and the
    host's memory: the OOM kills counted during the launch (0 when the reads do not compare)."""
    counts = _comparable(before, after)
    kills, where = 0, ""
    if counts is not None and after is not None:
        kills = counts[1] - counts[0]
        where = f"cgroup {after.cgroup}, oom_kill {counts[0]}→{counts[1]}"
    if host is None:
        return KernelRecord(kills, where)
    return KernelRecord(kills, where, host.effective_bytes(), host.words())


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
