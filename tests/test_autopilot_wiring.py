"""The autopilot wired into the supervisor ([autopilot] apply), as a table, with no child process: the fake
OS (tests/fake_os.py) plays each launch on a fake clock and serves the counters a KV cache under
pressure shows (preemptions), or not, depending on the launch's flags. The real-engine run is
bench/bench_autopilot.py; the same wiring against the engine stand-in's /metrics is in
tests/test_supervisor.py."""
from __future__ import annotations

import io
import json
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from engine_support import llama_config, write_model
from fake_os import FakeClock, FakeOs, Launch

from kvwatch.boundary.engine_http import EngineLoad
from kvwatch.commands.status import render
from kvwatch.engine_status import EngineStatus
from kvwatch.planner.devices import Device
from kvwatch.planner.rules import ruleset_for
from kvwatch.policy import Policy
from kvwatch.watchdog.autopilot import Apply, AutopilotConfig
from kvwatch.watchdog.config import Config, EngineConfig
from kvwatch.watchdog.sd_notify import SdNotifier
from kvwatch.watchdog.state_store import StateStore
from kvwatch.watchdog.supervisor import Supervisor

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
DIED = (LOGS / "cpu_engine_died.log").read_text()          # engine_died: a restart kvwatch makes anyway
FP8_CPU = Device("cpu", "test cpu (AVX-512)", cpu_fp8_kv=True, source="cpu")
POLICY = Policy(backoff_initial_seconds=0.5, backoff_max_seconds=1.0, max_restarts=5, max_corrections=3,
                restart_window_seconds=600, stable_seconds=600, preflight=False)
WALL = 1_800_000_000.0 - 100.0                              # the fake OS's wall clock starts at 2027-01-15 08:00 UTC
OPEN, CLOSED = "07:00-09:00", "12:00-13:00"
FP8 = "--kv-cache-dtype fp8"


def fp8(argv: tuple[str, ...] | list[str]) -> bool:
    return "--kv-cache-dtype" in argv and argv[list(argv).index("--kv-cache-dtype") + 1] == "fp8"


@dataclass
class Pressure:
    """The engine's series: 2 requests running, 1 waiting, 10 tokens/s, and 12 preemptions a minute unless
    the change helps (`fp8_helps`). While kvwatch drains, the running requests finish after 3 s."""
    fp8_helps: bool = True
    drain_started: float | None = None
    clock: FakeClock = field(default_factory=FakeClock)

    def __call__(self, argv: tuple[str, ...], age: float) -> EngineLoad:
        preempting = not (fp8(argv) and self.fp8_helps)
        draining = self.drain_started is not None and self.clock.now() - self.drain_started >= 3.0
        return EngineLoad(running=0.0 if draining else 2.0, waiting=0.0 if draining else 1.0,
                          prompt_tokens=100 + age, generation_tokens=10.0 * age,
                          preemptions=(12.0 * age / 60.0) if preempting else 0.0)

    def observe(self, status: EngineStatus) -> None:
        if status.ending and status.ending.startswith("autopilot: draining"):
            self.drain_started = self.drain_started if self.drain_started is not None else self.clock.now()
        elif not status.ending:
            self.drain_started = None


DIES = Launch(ready_after=2, exit_after=40, log=DIED)
DIES_SOON = Launch(ready_after=2, exit_after=15, log=DIED)   # before its trial is measured
SERVES = Launch(ready_after=2)

# name, apply, window, launches, fp8 helps, fixed flags, fp8 in each launch, counts, the results in the state file
ROWS = [
    ("never: recommended only", Apply.NEVER, None, [SERVES], True, (), [False], {}, []),
    ("at_restart: not without a restart", Apply.AT_RESTART, None, [SERVES], True, (), [False],
     {}, []),
    ("at_restart: applied with the restart kvwatch makes anyway, kept", Apply.AT_RESTART, None, [DIES, SERVES], True,
     (), [False, True], {"applied": 1, "kept": 1}, ["kept"]),
    ("at_restart: the engine fails on trial: rolled back at that restart", Apply.AT_RESTART, None,
     [DIES, DIES_SOON, SERVES], True, (), [False, True, False], {"applied": 1, "rolled_back": 1}, ["rolled_back"]),
    ("window: drained, applied, measured better, kept", Apply.WINDOW, OPEN, [SERVES], True, (), [False, True],
     {"applied": 1, "kept": 1}, ["kept"]),
    ("window: measured worse, rolled back, never tried again", Apply.WINDOW, OPEN, [SERVES], False, (),
     [False, True, False], {"applied": 1, "rolled_back": 1}, ["rolled_back"]),
    ("window: closed now: recommended only", Apply.WINDOW, CLOSED, [SERVES], True, (), [False], {}, []),
    ("window: a fixed flag is recommended, never applied", Apply.WINDOW, OPEN, [SERVES], True, ("--kv-cache-dtype",),
     [False], {}, []),
]


def run_row(tmp_path: Path, apply: Apply, window: str | None, launches: list[Launch], fp8_helps: bool,
            fixed: tuple[str, ...], stop_after: float = 200.0,
            per_day: int = 1, stop_on_drain: bool = False) -> tuple[Supervisor, FakeOs, list[EngineStatus], Config]:
    model = tmp_path / "tiny"
    if not model.exists():
        write_model(model, llama_config())
    argv = ("vllm", "serve", str(model), "--port", "8000")
    engine = EngineConfig(command=argv, start_timeout_seconds=10.0, health_interval_seconds=1.0,
                          hang_timeout_seconds=4.0, stop_timeout_seconds=3.0, stall_timeout_seconds=0.0,
                          pressure_window_seconds=20.0)
    config = Config(name="t", state_dir=str(tmp_path / "state"), policy=replace(POLICY, fixed_flags=fixed),
                    engine=engine, autopilot=AutopilotConfig(apply, window, drain_timeout_seconds=10.0,
                                                             measure_seconds=30.0, max_changes_per_day=per_day))
    clock = FakeClock()
    load = Pressure(fp8_helps, clock=clock)
    fake_os = FakeOs(clock, launches, load=load, wall_base=WALL)
    statuses: list[EngineStatus] = []

    def stop_when_draining(status: EngineStatus) -> None:
        if stop_on_drain and status.ending and status.ending.startswith("autopilot: draining"):
            sup.request_stop("test stop while draining")
    sup = Supervisor(config, observers=[statuses.append, load.observe, stop_when_draining], clock=clock, device=FP8_CPU,
                     rules=ruleset_for("0.32.0"), notifier=SdNotifier(None), output=io.BytesIO(), environ={},
                     probe=fake_os.probe, os_interface=fake_os)
    clock.at(clock.now() + stop_after, lambda: sup.request_stop("test stop"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kvwatch.boundary.engine_http.scrape", fake_os.scrape)
        assert sup.run() == 0
    return sup, fake_os, statuses, config


@pytest.mark.parametrize("name,apply,window,launches,fp8_helps,fixed,launched,counts,results", ROWS,
                         ids=[r[0] for r in ROWS])
def test_the_autopilot_in_each_mode(tmp_path: Path, name: str, apply: Apply, window: str | None,
                                    launches: list[Launch], fp8_helps: bool, fixed: tuple[str, ...],
                                    launched: list[bool], counts: dict[str, int], results: list[str]) -> None:
    sup, fake_os, statuses, config = run_row(tmp_path, apply, window, launches, fp8_helps, fixed)
    assert [fp8(argv) for argv in fake_os.spawned] == launched
    assert sup.status.autopilot == counts and sup.status.autopilot_trial is None
    assert any(s.recommendation is not None and s.recommendation.change.describe() == FP8 for s in statuses)
    record = json.loads((Path(config.state_dir) / "t.json").read_text())
    assert [c["result"] for c in record["autopilot_changes"]] == results
    assert record["autopilot_trial"] == {}
    assert all(e.poll() is not None for e in fake_os.engines)   # no engine left behind
    if not results:
        return
    change = record["autopilot_changes"][0]
    assert change["describe"] == FP8 and change["before"]["preemptions_per_minute"] == pytest.approx(12, abs=1)
    if "rolled_back" in results:   # never again for that profile, and the plan before serves
        assert list(record["autopilot_rolled_back"].values()) == [[{"set": {"--kv-cache-dtype": "fp8"}, "remove": []}]]
        assert not fp8(sup.command.argv) and sup.status.recommendation is None
    else:
        assert change["after"]["preemptions_per_minute"] == 0 and fp8(sup.command.argv)
    if change["after"] is not None:
        assert change["after"]["tokens_per_second"] == pytest.approx(10, rel=0.05)
        assert change["after"]["seconds"] >= 0.8 * config.autopilot.measure_seconds
    shown = render(Path(config.state_dir) / "t.json", StateStore(config.state_dir, "t").load())
    day = time.strftime("%Y-%m-%d", time.localtime(change["at"]))
    assert re.search(rf"^autopilot +{day} [\d:]+ {FP8}: {results[0]}; preemptions/min 12.0 -> ", shown, re.M), shown


def test_a_window_change_drains_first_readiness_503_then_relaunches(tmp_path: Path) -> None:
    """The engine is drained (readiness 503, the running requests finish: 3 s here) before it is stopped
    and relaunched with the change; the relaunch is no failure."""
    sup, fake_os, statuses, _ = run_row(tmp_path, Apply.WINDOW, OPEN, [SERVES], True, ())
    draining = [s for s in statuses if s.ending and s.ending.startswith("autopilot: draining")]
    assert draining and draining[0].ending == f"autopilot: draining to apply {FP8}"
    assert draining[0].state.value == "ready"   # still READY, yet readiness says 503 (exporter/hook.py)
    relaunch = next(s for s in statuses if s.state.value == "backoff")
    assert relaunch.reason == f"autopilot: apply {FP8}; relaunch now"
    assert sup.status.failures == {} and sup.status.restarts == {}
    assert fake_os.stops == 2   # the drained engine, then the last one at the stop


def test_the_daily_bound_holds_a_second_change(tmp_path: Path) -> None:
    """After a roll-back no other change is tried within the day: the record shows one change."""
    sup, fake_os, _, config = run_row(tmp_path, Apply.WINDOW, OPEN, [SERVES], False, (), stop_after=400.0)
    record = json.loads((Path(config.state_dir) / "t.json").read_text())
    assert len(record["autopilot_changes"]) == 1 and len(fake_os.spawned) == 3


def test_a_stop_while_draining_leaves_the_change_to_the_next_kvwatch(tmp_path: Path) -> None:
    """Stopped in the middle of the drain: the state file has the new command and its trial, so the next
    kvwatch launches the change and measures it (here: kept)."""
    sup, fake_os, statuses, config = run_row(tmp_path, Apply.WINDOW, OPEN, [SERVES], True, (), stop_on_drain=True)
    record = json.loads((Path(config.state_dir) / "t.json").read_text())
    assert [fp8(argv) for argv in fake_os.spawned] == [False]
    assert fp8(record["argv"]) and record["autopilot_trial"]["change"] == {"set": {"--kv-cache-dtype": "fp8"},
                                                                           "remove": []}
    sup, fake_os, statuses, config = run_row(tmp_path, Apply.WINDOW, OPEN, [SERVES], True, ())
    assert [fp8(argv) for argv in fake_os.spawned] == [True]
    record = json.loads((Path(config.state_dir) / "t.json").read_text())
    assert [c["result"] for c in record["autopilot_changes"]] == ["kept"] and record["autopilot_trial"] == {}
