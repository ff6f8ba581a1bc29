"""Reaction time of the watchdog: from the failure's root-cause line written by the engine to
the corrected engine spawned, with backoff zero (issue 7, item 4: median <= 250 ms over 20 runs).

The real Supervisor (as `kvwatch run` runs it, in its own thread) supervises
tests/fake_engine.py with --block-size 8 and preflight off: the first launch prints the real
vLLM CPU log of that failure and exits 1; kvwatch diagnoses it, corrects the block size to 32
and launches again. A thin wrapper around fake_engine records, in the child, time.time() right
after the log (with its root cause) is written and flushed, and the start of each child. The
supervisor's own log lines ("exited:", "failed:", "spawned:") give the steps in between.

Side by side in one run: the default engine config (health_interval_seconds 5, so the watch
loop ticks every 1 s) and a 0.2 s health interval (tick 0.2 s), both with backoff 0.

Run: .venv/bin/python bench/bench_reaction.py [--runs 20]
     [--supervisor FILE]   an experimental copy of kvwatch/watchdog/supervisor.py to measure instead
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from engine_support import free_port, llama_config, write_model  # noqa: E402

from kvwatch.planner.devices import Device  # noqa: E402
from kvwatch.planner.rules import ruleset_for  # noqa: E402
from kvwatch.policy import Policy  # noqa: E402
from kvwatch.watchdog.config import Config, EngineConfig  # noqa: E402
from kvwatch.watchdog.sd_notify import SdNotifier  # noqa: E402
from kvwatch.watchdog.supervisor import Supervisor  # noqa: E402

BAR_S = 0.250
CPU = Device("cpu", "bench cpu (no AVX-512)", cpu_fp8_kv=False, source="cpu")
POLICY = Policy(preflight=False, backoff_initial_seconds=0.0, backoff_max_seconds=0.0, stable_seconds=600)
WRAPPER = r'''
import os, sys, time
sys.path.insert(0, os.environ["BENCH_TESTS"])
mark = os.environ["BENCH_MARK"]
with open(mark, "a") as f:
    f.write(f"start {time.time()!r}\n")
import fake_engine
emit = fake_engine.emit
def timed_emit(path):
    emit(path)  # writes the whole failure log, root cause included, and flushes
    with open(mark, "a") as f:
        f.write(f"rootcause {time.time()!r}\n")
fake_engine.emit = timed_emit
sys.argv = [fake_engine.__file__, *sys.argv[1:]]
sys.exit(fake_engine.main())
'''


class Lines(logging.Handler):
    """The supervisor's log lines with their wall-clock time (record.created is time.time())."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.created, record.getMessage()))

    def first(self, prefix: str) -> float:
        return next(t for t, msg in self.seen if msg.startswith(prefix))


def one_run(tmp: Path, model: Path, health_interval: float, lines: Lines) -> dict[str, float]:
    mark = tmp / "mark.txt"
    argv = [sys.executable, "-c", WRAPPER, "--model", str(model), "--port", str(free_port()), "--block-size", "8"]
    engine = EngineConfig(command=tuple(argv), health_interval_seconds=health_interval, stop_timeout_seconds=5.0,
                          environment={"BENCH_MARK": str(mark), "BENCH_TESTS": str(ROOT / "tests")})
    config = Config(name="bench", state_dir=str(tmp / "state"), engine=engine, policy=POLICY)
    lines.seen.clear()
    with open(os.devnull, "wb") as null:
        sup = Supervisor(config, device=CPU, rules=ruleset_for("0.32.0"), output=null, notifier=SdNotifier(None))
        thread = threading.Thread(target=sup.run, name="supervisor")
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while sum(1 for _, m in lines.seen if m.startswith("spawned:")) < 2:
                assert time.monotonic() < deadline and thread.is_alive(), f"no second spawn: {sup.status}"
                time.sleep(0.01)
            while mark.read_text().count("start ") < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # the corrected child's own start, before it is stopped
        finally:
            sup.request_stop("bench done")
            thread.join(30)
    assert sup.command.get("--block-size") == "32", sup.command.argv
    marks = [line.split() for line in mark.read_text().splitlines()]
    root = next(float(t) for k, t in marks if k == "rootcause")
    starts = [float(t) for k, t in marks if k == "start"]
    spawned = [t for t, m in lines.seen if m.startswith("spawned:")][1]
    return {"exited": lines.first("exited:") - root, "diagnosed": lines.first("failed:") - root,
            "spawned": spawned - root, "child running": (starts[1] if len(starts) > 1 else float("nan")) - root}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--supervisor", metavar="FILE", help="measure Supervisor from this file instead (an experiment)")
    args = p.parse_args()
    runs = args.runs
    if args.supervisor:
        global Supervisor
        spec = importlib.util.spec_from_file_location("experimental_supervisor", args.supervisor)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        Supervisor = module.Supervisor
        print(f"Supervisor from {args.supervisor}")
    lines = Lines()
    log = logging.getLogger(Supervisor.__module__)
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    log.propagate = False
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {runs} runs each, "
          f"times from the root-cause line written by the child (ms)")
    print(f"{'config':<34}{'step':<34}{'median':>8}{'p90':>8}{'max':>8}")
    medians = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        model = write_model(Path(tmpdir) / "tiny", llama_config())
        for label, interval in (("default (health 5 s, tick 1 s)", 5.0), ("health_interval 0.2 s", 0.2)):
            results = []
            for i in range(runs):
                run_dir = Path(tmpdir) / f"{interval}-{i}"
                run_dir.mkdir()
                results.append(one_run(run_dir, model, interval, lines))
            for step, name in (("exited", "child exit noticed, group ended"), ("diagnosed", "diagnosed ('failed:')"),
                               ("spawned", "corrected child spawned"), ("child running", "corrected child's own start")):
                xs = [r[step] * 1000 for r in results]
                print(f"{label:<34}{name:<34}{statistics.median(xs):8.1f}{pct(xs, 0.9):8.1f}{max(xs):8.1f}")
                label = ""
            medians[interval] = statistics.median(r["spawned"] for r in results)
    for interval, median in medians.items():
        verdict = "PASS" if median <= BAR_S else "MISS"
        print(f"health_interval {interval:g} s: median to spawn {median * 1000:.0f} ms, "
              f"ratio to the {BAR_S * 1000:.0f} ms bar {median / BAR_S:.2f}: {verdict}")


if __name__ == "__main__":
    main()
