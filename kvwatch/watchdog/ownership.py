"""Which processes are the engine's: proven from what kvwatch recorded when it spawned it, never
from a title or an environment variable (vLLM's setproctitle overwrites the environment a marker
would live in; anyone can choose a title).

At spawn kvwatch records the engine's pid, start time, process group, session, user and cgroup in
the state file (EngineProof). The engine starts a session of its own, and every process it starts
stays in that session unless it calls setsid. A process now on the host is the engine's (OWN) when:
- it is the engine itself (same pid and start time: a reused pid has another start time), or a
  process recorded in the state file while it was in the engine's tree (pid and start time);
- it is in the recorded session or group, runs as the engine's user and started after the engine;
  unless that session's leader is alive and is not the engine (a reused session id);
- its parent chain reaches a process proven OWN (a child that called setsid while its parent lives);
- it was adopted by kvwatch (`adopter`): kvwatch is the child subreaper of what it spawns, so an
  orphan of the engine's tree (a double fork, setsid or not) is re-parented to kvwatch, not to init.
What escapes proof but calls itself vLLM's, started after the engine, runs as its user, is an orphan
and is claimed by no other kvwatch is an ESCAPED lookalike: reported, never signalled. Everything
else is FOREIGN.
What cannot be caught: a descendant that calls setsid and whose parent then exits, when kvwatch is
not its subreaper (kvwatch as PID 1, or killed: the orphan goes to init) and it was never recorded
(it left after kvwatch's last look at the tree). Without a cgroup of kvwatch's own, nothing that
/proc shows ties it to the engine then; if it calls itself vLLM's it is reported.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvwatch.vllm_releases.process_titles import looks_like_vllm

START_TOLERANCE = 0.05   # seconds: a process's start time as psutil reads it is stable to the tick


@dataclass(frozen=True)
class EngineProof:
    """What kvwatch records at spawn (the state file's `engine_proof`)."""

    pid: int
    create_time: float
    pgid: int
    sid: int
    uid: int | None = None
    cgroup: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "create_time": self.create_time, "pgid": self.pgid, "sid": self.sid,
                "uid": self.uid, "cgroup": self.cgroup}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> EngineProof:
        """ValueError on anything that is not a proof."""
        def whole(key: str, optional: bool = False) -> Any:
            value = data.get(key)
            if value is None and optional:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 31:
                raise ValueError(f"engine_proof: {key} is {value!r}")
            return value
        ct = data.get("create_time")
        if not isinstance(ct, (int, float)) or isinstance(ct, bool):
            raise ValueError(f"engine_proof: create_time is {ct!r}")
        cgroup = data.get("cgroup")
        if cgroup is not None and not isinstance(cgroup, str):
            raise ValueError(f"engine_proof: cgroup is {cgroup!r}")
        if whole("pid") == 0 or whole("pgid") == 0 or whole("sid") == 0:
            raise ValueError("engine_proof: pid 0")
        return EngineProof(whole("pid"), float(ct), whole("pgid"), whole("sid"), whole("uid", True), cgroup)


@dataclass(frozen=True)
class Seen:
    """One process as the host shows it now."""

    pid: int
    ppid: int
    pgid: int | None
    sid: int | None
    uid: int | None
    create_time: float
    name: str = ""
    cmdline: tuple[str, ...] = ()


class Verdict(Enum):
    OWN = "own"
    ESCAPED = "escaped"     # looks like the engine's, not provably: reported, never signalled
    FOREIGN = "foreign"


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    why: str


def _same_start(a: float, b: float) -> bool:
    return abs(a - b) <= START_TOLERANCE


def judge(processes: Sequence[Seen], proof: EngineProof | None, recorded: Iterable[tuple[int, float]] = (),
          *, others: frozenset[int] = frozenset(), skip: frozenset[int] = frozenset(),
          adopter: int | None = None, title_prefix: str | None = None) -> dict[int, Judgement]:
    """A verdict for every process in `processes` (the host's). `recorded`: (pid, start time) of
    processes seen in the engine's tree (the state file's pids); `others`: pids other kvwatch
    instances claim; `skip`: kvwatch itself and its reaper (never the engine's, whatever they share);
    `adopter`: kvwatch's pid when it is the engine's child subreaper (not PID 1)."""
    by_pid = {p.pid: p for p in processes}
    marks = dict(recorded)
    out: dict[int, Judgement] = {}

    def direct(p: Seen) -> Judgement | None:
        if p.pid in skip:
            return Judgement(Verdict.FOREIGN, "kvwatch itself")
        if proof is None:
            return None
        if proof.uid is not None and p.uid is not None and p.uid != proof.uid:
            return Judgement(Verdict.FOREIGN, f"runs as uid {p.uid}, the engine as {proof.uid}")
        if p.pid == proof.pid and _same_start(p.create_time, proof.create_time):
            return Judgement(Verdict.OWN, "the engine kvwatch spawned (pid and start time)")
        if p.create_time < proof.create_time - START_TOLERANCE:
            return Judgement(Verdict.FOREIGN, "started before the engine")
        if p.pid in marks and _same_start(p.create_time, marks[p.pid]):
            return Judgement(Verdict.OWN, "recorded in the engine's tree (pid and start time)")
        if adopter is not None and p.ppid == adopter:
            return Judgement(Verdict.OWN, "an orphan of the engine's tree, adopted by kvwatch (its subreaper)")
        for what, value, leader_pid in (("session", p.sid, proof.sid), ("group", p.pgid, proof.pgid)):
            if value != leader_pid:
                continue
            leader = by_pid.get(leader_pid)
            if leader is not None and not (leader.pid == proof.pid and _same_start(leader.create_time,
                                                                                     proof.create_time)):
                return Judgement(Verdict.FOREIGN, f"the {what} {value} is another process's (its id was reused)")
            return Judgement(Verdict.OWN, f"in the engine's {what} {value}, started after it")
        return None

    def verdict(p: Seen, depth: int = 0) -> Judgement:
        if p.pid in out:
            return out[p.pid]
        found = direct(p)
        if found is None and proof is not None and depth < 64:   # a parent chain, bounded (pid loops)
            parent = by_pid.get(p.ppid)
            if parent is not None and parent.pid not in (0, 1, p.pid) and verdict(parent, depth + 1).verdict is Verdict.OWN:
                found = Judgement(Verdict.OWN, f"a descendant of the engine's pid {parent.pid}")
        if found is None:
            found = _unproven(p, proof, others, skip, by_pid, title_prefix)
        out[p.pid] = found
        return found

    for p in processes:
        verdict(p)
    return out


def _unproven(p: Seen, proof: EngineProof | None, others: frozenset[int], skip: frozenset[int],
              by_pid: Mapping[int, Seen], title_prefix: str | None) -> Judgement:
    """ESCAPED: what could have come from the engine and calls itself vLLM's. It started after the
    engine, runs as its user, is claimed by no other kvwatch, and is an orphan (its parent gone:
    re-parented to init or to kvwatch as PID 1); a vLLM someone else runs has a live parent."""
    if proof is None or p.pid in others or p.pid in skip:
        return Judgement(Verdict.FOREIGN, "not the engine's")
    if proof.uid is not None and p.uid is not None and p.uid != proof.uid:
        return Judgement(Verdict.FOREIGN, "not the engine's")
    orphan = p.ppid in (0, 1) or p.ppid in skip or p.ppid not in by_pid
    looks = looks_like_vllm(p.name, p.cmdline) if title_prefix is None else looks_like_vllm(p.name, p.cmdline,
                                                                                             title_prefix)
    if looks and orphan and p.create_time >= proof.create_time - START_TOLERANCE:
        return Judgement(Verdict.ESCAPED, "an orphan that calls itself vLLM's, not provably the engine's")
    return Judgement(Verdict.FOREIGN, "not the engine's")


def owned(judged: Mapping[int, Judgement]) -> list[int]:
    return sorted(pid for pid, j in judged.items() if j.verdict is Verdict.OWN)


def escaped(judged: Mapping[int, Judgement]) -> list[int]:
    return sorted(pid for pid, j in judged.items() if j.verdict is Verdict.ESCAPED)
