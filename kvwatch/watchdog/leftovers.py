"""Which processes on the host are the engine's, and ending them: at a stop, at a restart, and
before a launch (what an earlier kvwatch, killed with its reaper, left behind).

The proof is kvwatch/watchdog/ownership.py's, from what the state file recorded at spawn (the
engine's pid, start time, session, group, user). Processes proven the engine's are ended;
those that call themselves vLLM's but are not provably the engine's are reported (a log line, the
state file's `escaped`, kvwatch_engine_escaped_processes), never signalled. The marker variable
kvwatch still sets in the engine's environment is a guard for the container's `vllm` shim, not a
proof: vLLM's setproctitle overwrites the memory /proc/PID/environ reads.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kvwatch.boundary import proc_inspect, spawn
from kvwatch.boundary.proc_inspect import HostProcess, ProcRef
from kvwatch.watchdog import disk_writer
from kvwatch.watchdog.ownership import EngineProof, Judgement, Seen, Verdict, judge
from kvwatch.watchdog.sd_notify import scrub_env

_LOG = logging.getLogger(__name__)

MARKER_ENV = "KVWATCH_ENGINE"
MAX_SWEEPS = 3   # what forks while being ended is caught by the next sweep


def marker(state_dir: str, name: str) -> str:
    return f"{name}@{os.path.abspath(state_dir)}"


def engine_env(environ: Mapping[str, str], configured: Mapping[str, str], state_dir: str,
               name: str) -> dict[str, str]:
    """The engine's environment: kvwatch's less systemd's (scrub_env), the configured one, unbuffered
    output, and the marker that names its processes this kvwatch's engine's."""
    env = scrub_env(environ)
    env.update(configured)
    env.setdefault("PYTHONUNBUFFERED", "1")  # vLLM logs to stdout: unbuffered, so a crash loses nothing
    env[MARKER_ENV] = marker(state_dir, name)
    return env


@dataclass
class CleanupReport:
    stopped: list[int] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)   # "pid 123 (python, user x) holds port 8000"
    escaped: list[str] = field(default_factory=list)   # looks like the engine's, not provably: left alone


@dataclass(frozen=True)
class Scan:
    """One look at the host against the engine's proof."""

    owned: tuple[ProcRef, ...]
    escaped: tuple[str, ...]          # descriptions of the lookalikes
    judged: dict[int, Judgement]


def proof_of(pid: int, pgid: int, create_time: float) -> EngineProof | None:
    """The proof to record for an engine just spawned (None when it is gone already)."""
    seen = proc_inspect.host_process(pid)
    if seen is None or seen.sid is None:
        return None
    return EngineProof(pid, create_time, pgid, seen.sid, seen.uid, proc_inspect.cgroup_of(pid))


def adopter() -> int | None:
    """kvwatch's pid when the orphans it adopts are provably the engine's: kvwatch is the child
    subreaper of what it spawns and not PID 1 (as a container's PID 1 it adopts every orphan of the
    container, a `docker exec` shell's too)."""
    pid = os.getpid()
    return pid if pid != 1 and spawn.is_subreaper() else None


def _seen(p: HostProcess) -> Seen:
    return Seen(p.pid, p.ppid, p.pgid, p.sid, p.uid, p.create_time, p.name, p.cmdline)


def scan(proof: EngineProof | None, recorded: Iterable[ProcRef], skip: Iterable[int] = (),
         others: frozenset[int] = frozenset()) -> Scan:
    hosts = proc_inspect.host_processes()
    judged = judge([_seen(p) for p in hosts], proof, [(r.pid, r.create_time) for r in recorded],
                   others=others, skip=frozenset(skip) | {os.getpid()} | disk_writer.helper_pids(),
                   adopter=adopter())
    by_pid = {p.pid: p for p in hosts}
    owned = tuple(ProcRef(pid, by_pid[pid].create_time) for pid, j in sorted(judged.items())
                  if j.verdict is Verdict.OWN)
    escaped = tuple(f"{proc_inspect.describe(pid)} {' '.join(by_pid[pid].cmdline)[:120]!r}: {j.why}"
                    for pid, j in sorted(judged.items()) if j.verdict is Verdict.ESCAPED)
    return Scan(owned, escaped, judged)


def end_owned(proof: EngineProof | None, recorded: Iterable[ProcRef], timeout: float,
              sleep: Callable[[float], None] = time.sleep, skip: Iterable[int] = (),
              others: frozenset[int] = frozenset()) -> tuple[list[int], list[str]]:
    """End every process proven the engine's (SIGTERM, SIGKILL after `timeout`), sweeping again
    for what forked meanwhile; the pids ended, and the lookalikes left alone."""
    recorded, skip = list(recorded), list(skip)
    stopped: list[int] = []
    found = scan(proof, recorded, skip, others)
    for _ in range(MAX_SWEEPS):
        if not found.owned:
            break
        for ref in found.owned:
            _LOG.info("ownership: pid %d is the engine's: %s", ref.pid, found.judged[ref.pid].why)
        spawn.stop_each(list(found.owned), timeout, sleep)
        stopped += [r.pid for r in found.owned if r.pid not in stopped]
        recorded += list(found.owned)   # still proof for their children, now re-parented
        found = scan(proof, recorded, skip, others)
    for line in found.escaped:
        _LOG.warning("escaped: %s; reported, left alone", line)
    return stopped, list(found.escaped)


def clean(refs: list[ProcRef], proof: EngineProof | None, port: int | None,
          gpu_holders: Callable[[], Iterable[tuple[str, int]]], timeout: float,
          sleep: Callable[[float], None] = time.sleep, others: frozenset[int] = frozenset()) -> CleanupReport:
    """Before a launch: end what is left of the engine the state file recorded (proof and pids);
    then look at who holds the engine's port and GPUs (asked only after that, so what was just
    stopped is not reported)."""
    report = CleanupReport()
    report.stopped, report.escaped = end_owned(proof, refs, timeout, sleep, others=others)
    if report.stopped:
        _LOG.warning("leftovers: stopped our earlier engine processes %s", report.stopped)
    for ref in refs:
        if ref.pid not in report.stopped and proc_inspect.alive(ref) is not None:
            report.foreign.append(f"{proc_inspect.describe(ref.pid)} is recorded as ours but not provably the engine's")
    holders: list[tuple[str, int | None]] = []
    if port is not None:
        holders += [(f"port {port}", pid) for pid in proc_inspect.listening_on(port)]
    holders += [(f"GPU {gpu}", pid) for gpu, pid in gpu_holders()]
    me = os.getpid()
    for what, pid in holders:
        if pid is None:
            report.foreign.append(f"a process kvwatch cannot see holds {what}")
            continue
        if pid == me or not proc_inspect.running(pid):
            continue  # gone already (NVML may list a process for a moment after it exits)
        report.foreign.append(f"{proc_inspect.describe(pid)} holds {what}")
    for line in report.foreign:
        _LOG.warning("foreign: %s; not ours, left alone", line)
    return report

