"""Which processes are the engine's (kvwatch/watchdog/ownership.py), as a table: what kvwatch recorded
at spawn against what the host shows, never a title or an environment variable."""
from __future__ import annotations

import pytest

from kvwatch.vllm_releases.process_titles import looks_like_vllm
from kvwatch.watchdog.ownership import EngineProof, Seen, Verdict, escaped, judge, owned

UID, OTHER_UID = 1000, 1001
T0 = 1_700_000_000.0                     # the engine's start time
PROOF = EngineProof(pid=500, create_time=T0, pgid=500, sid=500, uid=UID)
ENGINE = Seen(500, 400, 500, 500, UID, T0, "VLLM::APIServer", ("VLLM::APIServer",))
CORE = Seen(510, 500, 500, 500, UID, T0 + 5, "VLLM::EngineCor", ("VLLM::EngineCore",))
KVWATCH = Seen(400, 1, 400, 300, UID, T0 - 10, "kvwatch", ("python", "-m", "kvwatch.cli", "run"))

O, E, F = Verdict.OWN, Verdict.ESCAPED, Verdict.FOREIGN

CASES = [
    # (case, processes on the host, recorded (pid, start), the pid judged, its verdict)
    ("the engine itself", [ENGINE], [], 500, O),
    ("a re-titled EngineCore in the engine's session: the title does not matter",
     [ENGINE, CORE], [], 510, O),
    ("the same EngineCore, its parent the API server killed (re-parented to init)",
     [Seen(510, 1, 500, 500, UID, T0 + 5, "VLLM::EngineCor", ("VLLM::EngineCore",))], [], 510, O),
    ("a double-forked daemon: cleared environment, new title, own group, same session",
     [ENGINE, Seen(520, 1, 520, 500, UID, T0 + 9, "daemon", ("daemon",))], [], 520, O),
    ("a daemon that called setsid while its parent (the engine's) still runs",
     [ENGINE, CORE, Seen(530, 510, 530, 530, UID, T0 + 9, "daemon", ("daemon",))], [], 530, O),
    ("a daemon that called setsid, its parent gone, recorded in the engine's tree",
     [Seen(530, 1, 530, 530, UID, T0 + 9, "daemon", ("daemon",))], [(530, T0 + 9)], 530, O),
    ("the same daemon never recorded, titled as vLLM: cannot be proven, reported",
     [Seen(530, 1, 530, 530, UID, T0 + 9, "VLLM::Worker", ("VLLM::Worker",))], [], 530, E),
    ("the same daemon never recorded, untitled: cannot be proven, not seen",
     [Seen(530, 1, 530, 530, UID, T0 + 9, "daemon", ("daemon",))], [], 530, F),
    ("pid reuse: the engine's pid, another start time",
     [Seen(500, 1, 77, 77, UID, T0 + 100, "bash", ("bash",))], [], 500, F),
    ("pid reuse of a recorded pid: another start time",
     [Seen(530, 1, 530, 530, UID, T0 + 90, "sleep", ("sleep",))], [(530, T0 + 9)], 530, F),
    ("a reused session id: its leader alive and not the engine",
     [Seen(500, 1, 500, 500, UID, T0 + 100, "sshd", ("sshd",)),
      Seen(540, 500, 500, 500, UID, T0 + 101, "bash", ("bash",))], [], 540, F),
    ("in the session but started before the engine (a reused id, an older process)",
     [Seen(550, 1, 500, 500, UID, T0 - 50, "bash", ("bash",))], [], 550, F),
    ("a foreign process of the same user", [ENGINE, Seen(560, 1, 560, 560, UID, T0 + 3, "sleep", ("sleep",))],
     [], 560, F),
    ("another user's process in the session (setuid): never",
     [ENGINE, Seen(570, 500, 500, 500, OTHER_UID, T0 + 3, "helper", ("helper",))], [], 570, F),
    ("another user's vLLM: foreign, not reported",
     [Seen(580, 1, 580, 580, OTHER_UID, T0 + 3, "VLLM::EngineCor", ("VLLM::EngineCore",))], [], 580, F),
    ("a vLLM of the same user that another kvwatch claims",
     [Seen(590, 1, 590, 590, UID, T0 + 3, "VLLM::EngineCor", ("VLLM::EngineCore",))], [], 590, F),
    ("an orphaned vLLM of the same user nobody claims, outside the session: reported",
     [Seen(591, 1, 591, 591, UID, T0 + 3, "VLLM::EngineCor", ("VLLM::EngineCore",))], [], 591, E),
    ("an orphaned `vllm serve` of the same user, outside the session: reported",
     [Seen(592, 1, 592, 592, UID, T0 + 3, "vllm", ("/usr/bin/python3", "/usr/bin/vllm", "serve", "m"))], [], 592, E),
    ("an orphan re-parented to kvwatch as PID 1, titled as vLLM: reported",
     [Seen(595, 400, 595, 595, UID, T0 + 3, "VLLM::Worker", ("VLLM::Worker",))], [], 595, E),
    ("someone's vLLM with a live parent (a shell, a test): foreign, not reported",
     [Seen(90, 1, 90, 90, UID, T0 - 99, "bash", ("bash",)),
      Seen(596, 90, 596, 596, UID, T0 + 3, "python", ("python", "-m", "vllm.entrypoints.openai.api_server"))],
     [], 596, F),
    ("an orphaned vLLM older than the engine: not from it, not reported",
     [Seen(597, 1, 597, 597, UID, T0 - 3, "VLLM::EngineCor", ("VLLM::EngineCore",))], [], 597, F),
    ("a recorded pid in a state file with no proof: proves nothing",
     [Seen(593, 1, 593, 593, UID, T0 + 3, "python", ("python",))], [(593, T0 + 3)], 593, F),
    ("a recorded pid that started before the engine (a hand-edited state file)",
     [Seen(594, 1, 594, 594, UID, T0 - 3, "python", ("python",))], [(594, T0 - 3)], 594, F),
    ("kvwatch itself, whatever it shares", [ENGINE, KVWATCH], [], 400, F),
    ("a descendant of kvwatch's (the reaper) is not the engine's",
     [ENGINE, KVWATCH, Seen(410, 400, 410, 410, UID, T0 + 1, "python", ("python", "-m", "kvwatch.watchdog.reaper"))],
     [], 410, F),
]


@pytest.mark.parametrize("processes,recorded,pid,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_verdicts(processes: list[Seen], recorded: list[tuple[int, float]], pid: int, want: Verdict) -> None:
    proof = None if "no proof" in next(c[0] for c in CASES if c[1] is processes) else PROOF
    judged = judge(processes, proof, recorded, others=frozenset({590}), skip=frozenset({400}))
    assert judged[pid].verdict is want, judged[pid].why


def test_a_parent_chain_loop_ends() -> None:
    """Two processes that name each other as parent (a pid reused mid-read) are judged, not looped on."""
    a = Seen(600, 601, 600, 600, UID, T0 + 1, "a")
    b = Seen(601, 600, 601, 601, UID, T0 + 1, "b")
    judged = judge([a, b], PROOF)
    assert {judged[600].verdict, judged[601].verdict} == {F}


def test_owned_and_escaped_lists() -> None:
    procs = [ENGINE, CORE, Seen(591, 1, 591, 591, UID, T0 + 3, "VLLM::EngineCor", ("VLLM::EngineCore",))]
    judged = judge(procs, PROOF)
    assert owned(judged) == [500, 510] and escaped(judged) == [591]


@pytest.mark.parametrize("data", [
    {}, {"pid": 1, "create_time": "x", "pgid": 1, "sid": 1},
    {"pid": True, "create_time": 1.0, "pgid": 1, "sid": 1},
    {"pid": 0, "create_time": 1.0, "pgid": 1, "sid": 1},
    {"pid": 1, "create_time": 1.0, "pgid": 1, "sid": 1, "cgroup": 5},
    {"pid": 1 << 40, "create_time": 1.0, "pgid": 1, "sid": 1},
])
def test_a_bad_proof_is_refused(data: dict) -> None:
    with pytest.raises(ValueError):
        EngineProof.from_json(data)


def test_a_proof_round_trips() -> None:
    proof = EngineProof(5, 1.5, 5, 5, 0, "/system.slice/kvwatch.service")
    assert EngineProof.from_json(proof.to_json()) == proof


@pytest.mark.parametrize("name,cmdline,want", [
    ("VLLM::EngineCor", ("VLLM::EngineCore",), True),
    ("VLLM::Worker_TP", (), True),
    ("python3", ("python3", "-m", "vllm.entrypoints.openai.api_server"), True),
    ("vllm", ("/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"), True),
    ("python", ("python", "scripts/gen_vllm_architectures.py"), False),
    ("python", ("python", "-m", "vllm.model_executor.models.registry"), False),
    ("python3", ("python3", "-m", "http.server"), False),
    ("sleep", ("sleep", "60", "vllm"), False),   # a word far down the command line is no title
])
def test_what_calls_itself_vllm(name: str, cmdline: tuple[str, ...], want: bool) -> None:
    assert looks_like_vllm(name, cmdline) is want
