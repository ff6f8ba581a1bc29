"""Every transition of the supervisor's state machine, as a table, with no child process: the fake OS
(tests/fake_os.py) plays each launch on a fake clock; the real-process tests remain in
tests/test_supervisor.py and tests/test_watchdog_e2e.py."""
from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from engine_support import llama_config, write_model
from fake_os import FakeClock, FakeOs, Launch

from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exitcodes import EXIT_GAVE_UP, EXIT_OK
from kvwatch.planner.devices import Device
from kvwatch.planner.rules import ruleset_for
from kvwatch.policy import Policy
from kvwatch.watchdog.config import Config, EngineConfig
from kvwatch.watchdog.sd_notify import SdNotifier
from kvwatch.watchdog.supervisor import _ALLOWED, Supervisor

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
BLOCK_8 = (LOGS / "cpu_block_size_8.log").read_text()      # block_size_unsupported: corrected to 32
DIED = (LOGS / "cpu_engine_died.log").read_text()          # engine_died: the same plan again
CPU = Device("cpu", "test cpu (no AVX-512)", cpu_fp8_kv=False, source="cpu")
POLICY = Policy(backoff_initial_seconds=0.5, backoff_max_seconds=1.0, max_restarts=3, max_corrections=3,
                restart_window_seconds=600, stable_seconds=600, preflight=False)

S = "stopped"
# name, launches, policy changes, stop after (fake seconds), states entered, exit code
ROWS = [
    ("serves, then is stopped", [Launch(ready_after=2)], {}, 10,
     [S, "starting", "ready", "stopping", S], EXIT_OK),
    ("a failure with a remedy: corrected and relaunched", [Launch(exit_after=1, log=BLOCK_8), Launch(ready_after=2)],
     {}, 20, [S, "starting", "backoff", "starting", "ready", "stopping", S], EXIT_OK),
    ("an exit no line names: restarted until the restart budget is spent, then FATAL",
     [Launch(exit_after=1, log="something no class names\n")], {}, None,
     [S, "starting", "backoff", "starting", "backoff", "starting", "backoff", "starting", "fatal"], EXIT_GAVE_UP),
    ("killed from outside while starting: restarted, and it serves",
     [Launch(exit_after=1, exit_code=-9), Launch(ready_after=1)], {}, 20,
     [S, "starting", "backoff", "starting", "ready", "stopping", S], EXIT_OK),
    ("a failure without a remedy: FATAL", [Launch(exit_after=1, log=BLOCK_8)], {"allow_block_size_change": False},
     None, [S, "starting", "fatal"], EXIT_GAVE_UP),
    ("a command that cannot start: FATAL", [Launch(spawn_error=True)], {}, None,
     [S, "starting", "fatal"], EXIT_GAVE_UP),
    ("stopped while starting", [Launch()], {}, 3, [S, "starting", "stopping", S], EXIT_OK),
    ("a serving engine dies: restarted, and stopped during the backoff",
     [Launch(ready_after=1, exit_after=5, log=DIED)], {"backoff_initial_seconds": 30, "backoff_max_seconds": 30}, 12,
     [S, "starting", "ready", "backoff", S], EXIT_OK),
    ("a serving engine dies with no restart left: FATAL", [Launch(ready_after=1, exit_after=5, log=DIED)],
     {"max_restarts": 0}, None, [S, "starting", "ready", "fatal"], EXIT_GAVE_UP),
    ("a hang after READY: restarted", [Launch(ready_after=1, unhealthy_after=3), Launch(ready_after=1)], {}, 30,
     [S, "starting", "ready", "backoff", "starting", "ready", "stopping", S], EXIT_OK),
    ("not ready within the start timeout: restarted", [Launch(), Launch(ready_after=1)], {}, 30,
     [S, "starting", "backoff", "starting", "ready", "stopping", S], EXIT_OK),
    ("asked to stop before the first launch", [Launch(ready_after=1)], {}, 0, [S], EXIT_OK),
]


@pytest.fixture(autouse=True)
def _no_process_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof that nothing here starts or reads a process: the boundary refuses."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the process boundary was called")
    for name in ("spawn", "stop_group", "stop_each"):
        monkeypatch.setattr(f"kvwatch.boundary.spawn.{name}", refuse)
    for name in ("tree", "host_processes", "host_process", "reap_orphans", "ref_of", "alive", "listening_on"):
        monkeypatch.setattr(f"kvwatch.boundary.proc_inspect.{name}", refuse)


class Recorder:
    def __init__(self) -> None:
        self.statuses: list[EngineStatus] = []

    def __call__(self, status: EngineStatus) -> None:
        self.statuses.append(status)

    def states(self) -> list[str]:
        out: list[str] = []
        for status in self.statuses:
            if not out or out[-1] != status.state.value:
                out.append(status.state.value)
        return out


def run_table_row(tmp_path: Path, launches: list[Launch], policy: dict, stop_after: float | None,
                  listeners: dict[int, list[int | None]] | None = None) -> tuple[Supervisor, FakeOs, Recorder, int]:
    model = write_model(tmp_path / "tiny", llama_config())
    argv = ("vllm", "serve", str(model), "--port", "8000", "--block-size", "8")
    engine = EngineConfig(command=argv, start_timeout_seconds=5.0, health_interval_seconds=1.0,
                          hang_timeout_seconds=4.0, stop_timeout_seconds=3.0)
    config = Config(name="t", state_dir=str(tmp_path / "state"), policy=replace(POLICY, **policy), engine=engine)
    clock = FakeClock()
    fake_os = FakeOs(clock, launches, listeners=listeners or {})
    recorder = Recorder()
    sup = Supervisor(config, observers=[recorder], clock=clock, device=CPU, rules=ruleset_for("0.32.0"),
                     notifier=SdNotifier(None), output=io.BytesIO(), environ={}, probe=fake_os.probe,
                     os_interface=fake_os)
    if stop_after == 0:
        sup.request_stop("test stop")
    elif stop_after is not None:
        clock.at(clock.now() + stop_after, lambda: sup.request_stop("test stop"))
    code = sup.run()
    return sup, fake_os, recorder, code


@pytest.mark.parametrize("name,launches,policy,stop_after,states,code", ROWS, ids=[r[0] for r in ROWS])
def test_every_transition_without_a_child_process(tmp_path: Path, name: str, launches: list[Launch], policy: dict,
                                                  stop_after: float | None, states: list[str], code: int) -> None:
    sup, fake_os, recorder, got = run_table_row(tmp_path, launches, policy, stop_after)
    assert (recorder.states(), got) == (states, code)
    assert all(e.poll() is not None for e in fake_os.engines)   # no engine left behind
    assert sup.status.pids == ()


def test_the_table_covers_every_allowed_transition(tmp_path: Path) -> None:
    seen: set[tuple[EngineState, EngineState]] = set()
    for i, (_, launches, policy, stop_after, _, _) in enumerate(ROWS):
        _, _, recorder, _ = run_table_row(tmp_path / str(i), launches, policy, stop_after)
        states = [EngineState(s) for s in recorder.states()]
        seen.update(zip(states, states[1:], strict=False))
    assert seen == _ALLOWED


def test_a_correction_relaunches_the_corrected_command_and_counts_once(tmp_path: Path) -> None:
    sup, fake_os, _, _ = run_table_row(tmp_path, [Launch(exit_after=1, log=BLOCK_8), Launch(ready_after=2)], {}, 20)
    first, second = fake_os.spawned
    assert first[first.index("--block-size") + 1] == "8"
    assert second[second.index("--block-size") + 1] == "32"
    assert sup.status.failures == {"block_size_unsupported": 1}
    assert sup.status.corrections == {"block_size_unsupported": 1}
    assert sup.status.restarts == {}
    assert sup.status.plan is not None and sup.status.plan.block_size == 32   # the plan in force follows


def test_a_restart_counts_once_and_the_record_is_stamped_by_the_os_wall_clock(tmp_path: Path) -> None:
    sup, fake_os, _, _ = run_table_row(tmp_path, [Launch(ready_after=1, unhealthy_after=3), Launch(ready_after=1)],
                                       {}, 30)
    assert sup.status.restarts == {"engine_died": 1} == sup.status.failures
    assert fake_os.spawned[0] == fake_os.spawned[1]   # the same plan again
    record = json.loads((tmp_path / "state" / "t.json").read_text())
    assert record["restarts"] == {"engine_died": 1}
    assert record["kvwatch_pid"] == 4242
    failure = record["failures"][0]
    assert failure["kind"] == "engine_died" and "/health failed" in failure["reason"]
    assert 1_700_000_100 < failure["time"] < 1_700_000_200   # the fake OS's wall clock, not time.time()


def test_an_illegal_transition_is_refused(tmp_path: Path) -> None:
    sup, _, _, _ = run_table_row(tmp_path, [Launch(ready_after=1)], {}, 0)
    with pytest.raises(RuntimeError, match="illegal transition stopped -> ready"):
        sup._transition(EngineState.READY, "never from STOPPED")


def test_a_kill_from_outside_is_named_and_restarted(tmp_path: Path) -> None:
    """Issue 42: SIGKILL while loading is a crash, restarted with the same plan and named as the kill."""
    sup, fake_os, recorder, code = run_table_row(
        tmp_path, [Launch(exit_after=1, exit_code=-9, log="INFO Starting to load model m...\n"),
                   Launch(ready_after=1)], {}, 20)
    assert code == EXIT_OK
    assert sup.status.failures == {"killed": 1} and sup.status.restarts == {"killed": 1}
    failure = sup._record.failures[-1]
    assert failure.evidence == "killed by signal 9 (SIGKILL) from outside while loading weights"
    assert failure.phase == "loading weights"
    assert fake_os.engines[0].argv == fake_os.engines[1].argv   # the same plan


def test_what_the_engine_says_after_kvwatchs_own_stop_is_no_cause(tmp_path: Path) -> None:
    """Its API server was killed from outside; kvwatch's SIGTERM to the rest of the group then made a worker die
    and the engine core log it as an ERROR. That line answers kvwatch's signal: the failure is the kill."""
    worker_died = ("(EngineCore pid=196) ERROR 12-07 00:21:46 [multiproc_executor.py:315] Worker proc VllmWorker-0 "
                   "died unexpectedly (exit code: None), shutting down executor.\n")
    sup, fake_os, _, code = run_table_row(
        tmp_path, [Launch(exit_after=1, exit_code=-9, log="INFO Starting to load model m...\n", at_stop=worker_died),
                   Launch(ready_after=1)], {}, 20)
    assert code == EXIT_OK
    assert sup.status.failures == {"killed": 1}, sup._record.failures
    assert sup._record.failures[-1].evidence == "killed by signal 9 (SIGKILL) from outside while loading weights"
    assert fake_os.engines[0].argv == fake_os.engines[1].argv


def test_an_error_said_before_the_kill_still_names_the_cause(tmp_path: Path) -> None:
    """The same ERROR line written before the API server's end (vLLM's API server SIGKILLs itself after a
    core's death): that is the cause, said as the engine said it."""
    worker_died = ("(EngineCore pid=196) ERROR 12-07 00:21:46 [multiproc_executor.py:315] Worker proc VllmWorker-0 "
                   "died unexpectedly (exit code: None), shutting down executor.\n")
    sup, _, _, code = run_table_row(
        tmp_path, [Launch(exit_after=1, exit_code=-9, log=worker_died, at_stop="INFO shutting down\n"),
                   Launch(ready_after=1)], {}, 20)
    assert code == EXIT_OK
    assert sup.status.failures == {"engine_died": 1}, sup._record.failures
    assert "Worker proc VllmWorker-0 died unexpectedly" in sup._record.failures[-1].evidence


ADDRESS_IN_USE = ("(APIServer pid=8) ERROR 12-07 03:55:30 [api_server.py:1] OSError: [Errno 98] "
                  "Address already in use\n")


@pytest.mark.parametrize("listeners,states,code,said", [
    ({}, [S, "starting", "backoff", "starting", "ready", "stopping", S], EXIT_OK,
     "nothing listens on port 8000 any more: it was taken only for a moment"),
    ({8000: [31337]}, [S, "starting", "fatal"], EXIT_GAVE_UP, "port 8000 is held by pid 31337"),
    ({8000: [None]}, [S, "starting", "fatal"], EXIT_GAVE_UP, "port 8000 is held by a process kvwatch cannot see"),
], ids=["taken for a moment: restarted", "held by a process: FATAL, named", "held by a hidden owner: FATAL"])
def test_a_port_in_use_is_fatal_only_while_a_process_listens_on_it(
        tmp_path: Path, listeners: dict[int, list[int | None]], states: list[str], code: int, said: str) -> None:
    """An outgoing connection may be given the engine's port as its local one for a moment (CI saw it): that is
    a crash, restarted as it is; a process listening on the port is a cause no restart fixes, named."""
    sup, fake_os, recorder, got = run_table_row(
        tmp_path, [Launch(exit_after=1, log=ADDRESS_IN_USE), Launch(ready_after=1)], {}, 20, listeners)
    assert (recorder.states(), got) == (states, code)
    assert sup.status.failures == {"port_in_use": 1}
    failure = sup._record.failures[-1]
    assert "Address already in use" in failure.evidence and said in failure.evidence
    if code == EXIT_OK:
        assert sup.status.restarts == {"port_in_use": 1}
        assert fake_os.spawned[0] == fake_os.spawned[1]   # the same plan: the port is not moved
    else:
        assert said in sup.status.reason and len(fake_os.spawned) == 1


def test_an_oom_kill_counted_by_the_cgroup_is_named_host_oom(tmp_path: Path) -> None:
    """The cgroup's oom_kill count rose during the launch: the kernel's OOM killer, said with the host's memory;
    the first in its phase is restarted as it is."""
    from kvwatch.values.host_memory import OomCount

    model = write_model(tmp_path / "tiny", llama_config())
    argv = ("vllm", "serve", str(model), "--port", "8000", "--block-size", "8")
    engine = EngineConfig(command=argv, start_timeout_seconds=5.0, health_interval_seconds=1.0,
                          hang_timeout_seconds=4.0, stop_timeout_seconds=3.0)
    config = Config(name="t", state_dir=str(tmp_path / "state"), policy=POLICY, engine=engine)
    clock = FakeClock()
    fake_os = FakeOs(clock, [Launch(exit_after=1, exit_code=-9), Launch(ready_after=1)],
                     oom_counts=[OomCount("/kvwatch.service", 2, 3), OomCount("/kvwatch.service", 2, 4)])
    sup = Supervisor(config, clock=clock, device=CPU, rules=ruleset_for("0.32.0"), notifier=SdNotifier(None),
                     output=io.BytesIO(), environ={}, probe=fake_os.probe, os_interface=fake_os)
    clock.at(clock.now() + 20, lambda: sup.request_stop("test stop"))
    assert sup.run() == EXIT_OK
    failure = sup._record.failures[-1]
    assert failure.kind == "host_oom" and sup.status.restarts == {"host_oom": 1}
    assert failure.evidence == ("the kernel's OOM killer ended the engine while starting "
                                "(cgroup /kvwatch.service, oom_kill 3→4); host memory: 24.0 GiB, cgroup limit none")


def _stopping_host(tmp_path: Path, extra: tuple[str, ...], samples: list) -> tuple[Supervisor, FakeOs]:
    model = write_model(tmp_path / "tiny", llama_config())
    argv = ("vllm", "serve", str(model), "--port", "8000", *extra)
    engine = EngineConfig(command=argv, start_timeout_seconds=50.0, health_interval_seconds=1.0,
                          hang_timeout_seconds=4.0, stop_timeout_seconds=3.0)
    config = Config(name="t", state_dir=str(tmp_path / "state"), policy=POLICY, engine=engine)
    clock = FakeClock()
    fake_os = FakeOs(clock, [Launch(ready_after=30), Launch(ready_after=1)], memory_samples=samples)
    sup = Supervisor(config, clock=clock, device=CPU, rules=ruleset_for("0.32.0"), notifier=SdNotifier(None),
                     output=io.BytesIO(), environ={}, probe=fake_os.probe, os_interface=fake_os)
    clock.at(clock.now() + 60, lambda: sup.request_stop("test stop"))
    return sup, fake_os


def test_host_memory_running_out_stops_the_engine_and_relaunches_it_with_less(tmp_path: Path) -> None:
    """A unified-memory host about to wedge: the group is stopped first, the stop recorded, and the relaunch
    keeps less in host memory (no second try of the plan that wedged it)."""
    from kvwatch.values.host_memory import HostMemorySample

    low = [HostMemorySample(0.0, 100 << 20, 120 << 30, 80.0, 60.0)]   # one read under the hard floor
    sup, fake_os = _stopping_host(tmp_path, ("--kv-offloading-size", "16"), low)
    assert sup.run() == EXIT_OK
    stop = sup._record.host_memory_stops[-1]
    assert stop.available_bytes == 100 << 20 and stop.boot_id == "fake-boot"
    assert sup._record.failures[-1].kind == "host_oom"
    assert list(fake_os.engines[1].argv[-2:]) == ["--kv-offloading-size", "8.0"]
    assert len(sup._record.host_memory_stops) == 1
    saved = json.loads((tmp_path / "state" / "t.json").read_text())
    assert saved["host_memory_stops"][-1]["reason"] == stop.reason


def test_a_stop_for_host_memory_no_failure_followed_is_replanned_at_the_next_start(tmp_path: Path) -> None:
    """The host wedged (or rebooted) before kvwatch could record a failure: the next start reads the stop
    record and launches with less host memory at once."""
    from kvwatch.watchdog.records import HostMemoryStop
    from kvwatch.watchdog.state_store import EngineRecord, StateStore

    sup, fake_os = _stopping_host(tmp_path, ("--cpu-offload-gb", "8"), [])
    argv = list(sup.command.argv)
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    stop = HostMemoryStop(1_600_000_000.0, "loading weights", "MemAvailable 0.1 GiB", argv, boot_id="old-boot")
    StateStore(str(state), "t").save(EngineRecord(name="t", original_argv=argv, argv=argv,
                                                  host_memory_stops=[stop]))
    assert sup.run() == EXIT_OK
    assert list(fake_os.engines[0].argv[-2:]) == ["--cpu-offload-gb", "4.0"]
    assert sup._record.failures[0].kind == "host_oom"
    assert "the host has rebooted since" in sup._record.failures[0].evidence


def test_a_stall_is_restarted_with_its_stacks_and_where_it_stuck(tmp_path: Path) -> None:
    """Issue 42: before a stall restart, the engine's stacks are read, where they say it stuck goes into the
    failure's words, and the stacks into its record."""
    from kvwatch.boundary.engine_http import EngineLoad
    from kvwatch.boundary.stack_dump import StackText
    from kvwatch.diagnosis.stall_stacks import parse_stacks, where_stuck
    from kvwatch.watchdog.stall_evidence import StallEvidence

    dump = ('Thread 0x7f (most recent call first):\n'
            '  File "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 2501 '
            'in all_reduce\n'
            '  File "/venv/lib/python3.12/site-packages/vllm/distributed/parallel_state.py", line 400 in all_reduce\n')
    stacks = (StackText("VLLM::Worker_TP0", "vllm", dump, None),)
    found = StallEvidence(stacks, where_stuck([t for s in stacks for t in parse_stacks(s.text or "", s.process)]))
    model = write_model(tmp_path / "tiny", llama_config())
    argv = ("vllm", "serve", str(model), "--port", "8000")
    engine = EngineConfig(command=argv, start_timeout_seconds=5.0, health_interval_seconds=1.0,
                          hang_timeout_seconds=4.0, stop_timeout_seconds=3.0, stall_timeout_seconds=5.0)
    config = Config(name="t", state_dir=str(tmp_path / "state"), policy=POLICY, engine=engine)
    clock = FakeClock()
    stuck = EngineLoad(running=2.0, waiting=0.0, prompt_tokens=100.0, generation_tokens=50.0)   # never moves
    fake_os = FakeOs(clock, [Launch(ready_after=1), Launch(ready_after=1)], load=lambda argv, age: stuck,
                     stall_found=found)
    sup = Supervisor(config, clock=clock, device=CPU, rules=ruleset_for("0.32.0"), notifier=SdNotifier(None),
                     output=io.BytesIO(), environ={}, probe=fake_os.probe, os_interface=fake_os)
    clock.at(clock.now() + 14, lambda: sup.request_stop("test stop"))
    assert sup.run() == EXIT_OK
    failure = next(f for f in sup._record.failures if f.kind == "stalled")
    assert fake_os.stall_looks and found.stuck is not None
    assert found.summary() in failure.evidence and "all_reduce" in failure.stacks
    assert sup.status.restarts.get("stalled") == 1
