"""Does kvwatch's log handling slow the engine? A child writes SIZE MB of log lines as fast as
it can; its own throughput is measured with stdout on /dev/null and under kvwatch's real path
(kvwatch.boundary.spawn.spawn: stdout+stderr on one pipe, drained by OutputPump, which splits and
decodes the lines, keeps the ring buffer, parses the startup facts and passes every line,
prefixed, to a sink that writes to /dev/null). A third case, the same pipe drained by `cat` to
/dev/null, shows what a plain pipe reader costs; a fourth, a 1 MiB pipe drained by a process that
does nothing but read in batches as kvwatch's pump does, is the floor: what the pipe itself costs.

Three writers (the child, inline below), all with PYTHONUNBUFFERED=1 as kvwatch runs the engine:
  - block: one 1000-line block written again and again (fake_engine.py --flood): the
    fastest writer there is, the worst case for any reader;
  - lines: each line formatted with its number and written by itself (one write(2) a line);
  - logging: Python's logging with vLLM's format: an engine logging as fast as it can.
The child reports its throughput, line count and last line; under kvwatch the sink counts the
lines and bytes it was handed and the ring's last line must be the child's: no line lost.
Each case runs RUNS times interleaved; medians are printed with the ratio to /dev/null.

Run: .venv/bin/python bench/bench_log_pump.py [--size MB] [--runs N] [--mode block|lines|logging|all]
     [--pump FILE]   also measure OutputPump from FILE (an experimental copy of kvwatch/watchdog/output_pump.py)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvwatch.boundary import spawn  # noqa: E402
from kvwatch.watchdog import output_pump  # noqa: E402
from kvwatch.watchdog.output_pump import OutputPump  # noqa: E402

BAR = 0.9
MODES = ("block", "lines", "logging")
WRITER = r'''
import json, os, sys, time
mode, size, report = sys.argv[1], int(float(sys.argv[2]) * 2**20), sys.argv[3]
out = sys.stdout.buffer
head = b"(Worker pid=4242) INFO 11-30 02:12:59 [loggers.py:259] Engine 000: request "
fill = b" Avg prompt throughput: 812.4 tokens/s, Running: 3 reqs, GPU KV cache usage: 4.2%"
written = lines = 0
start = time.perf_counter()
if mode == "block":
    line = head + b"00000000" + fill + b"\n"
    block = line * 1000
    while written < size:
        out.write(block)
        written += len(block)
        lines += 1000
    last = line
elif mode == "logging":
    import logging
    class Counting:
        def __init__(self, stream):
            self.stream, self.bytes, self.lines, self.last = stream, 0, 0, ""
        def write(self, text):
            self.bytes += len(text)
            self.lines += text.count("\n")
            self.last = text
            return self.stream.write(text)
        def flush(self):
            self.stream.flush()
    counting = Counting(sys.stdout)
    handler = logging.StreamHandler(counting)
    handler.setFormatter(logging.Formatter(
        "(Worker pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S"))
    log = logging.getLogger("vllm.v1.metrics.loggers")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    text_fill = fill.decode()
    while counting.bytes < size:
        log.info("Engine 000: request %08d%s", counting.lines, text_fill)
    written, lines, last = counting.bytes, counting.lines, counting.last.encode()
else:
    fd = out.fileno()
    while written < size:
        last = b"%s%08d%s\n" % (head, lines, fill)
        os.write(fd, last)
        written += len(last)
        lines += 1
out.flush()
elapsed = time.perf_counter() - start
json.dump({"bytes": written, "lines": lines, "seconds": elapsed, "last": last.decode().rstrip("\n")},
          open(report, "w"))
'''


class CountingSink:
    """The pump's pass-through output: counts what it was handed, writes it to /dev/null."""

    def __init__(self) -> None:
        self.out = open(os.devnull, "wb")
        self.lines = self.bytes = 0

    def write(self, data: bytes) -> int:
        self.lines += data.count(b"\n")
        self.bytes += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def child(mode: str, size: float, report: Path) -> list[str]:
    return [sys.executable, "-c", WRITER, mode, str(size), str(report)]


ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def run_devnull(mode: str, size: float, report: Path) -> dict:
    with open(os.devnull, "wb") as null:
        subprocess.run(child(mode, size, report), stdout=null, stderr=subprocess.STDOUT, check=True, env=ENV)
    return json.loads(report.read_text())


def run_cat(mode: str, size: float, report: Path) -> dict:
    with open(os.devnull, "wb") as null:
        cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=null)
        subprocess.run(child(mode, size, report), stdout=cat.stdin, stderr=subprocess.STDOUT, check=True, env=ENV)
        cat.stdin.close()
        cat.wait()
    return json.loads(report.read_text())


# The least any pipe reader can cost the writer: the pipe as kvwatch sizes it, read by a process
# that does nothing with the data and pauses by the pump's own rule (after a read under half the pipe).
FLOOR_READER = r'''
import fcntl, os, sys, time
pipe_bytes, pause = int(sys.argv[1]), float(sys.argv[2])
fcntl.fcntl(0, fcntl.F_SETPIPE_SZ, pipe_bytes)
while data := os.read(0, pipe_bytes):
    if len(data) < pipe_bytes // 2:
        time.sleep(pause)
'''


def run_floor(mode: str, size: float, report: Path) -> dict:
    reader = subprocess.Popen([sys.executable, "-c", FLOOR_READER, str(spawn._PIPE_BYTES),
                               str(output_pump._BATCH_PAUSE_S)], stdin=subprocess.PIPE)
    subprocess.run(child(mode, size, report), stdout=reader.stdin, stderr=subprocess.STDOUT, check=True, env=ENV)
    reader.stdin.close()  # type: ignore[union-attr]
    reader.wait()
    return json.loads(report.read_text())


def run_kvwatch(mode: str, size: float, report: Path, pump_class: type = OutputPump) -> dict:
    sink = CountingSink()
    proc = spawn.spawn(child(mode, size, report), ENV)
    pump = pump_class("bench", proc.stdout, sink).start()
    rc = proc.popen.wait()
    assert pump.join(timeout=120), "pump did not reach EOF"
    proc.close()
    sink.out.close()
    stats = json.loads(report.read_text())
    prefix = len(b"[bench] ")
    lost = stats["lines"] - sink.lines
    ok = (rc == 0 and lost == 0 and pump.lines_seen == stats["lines"]
          and sink.bytes == stats["bytes"] + prefix * stats["lines"] and pump.lines()[-1] == stats["last"])
    stats.update(lost=lost, intact=ok, sink_lines=sink.lines)
    return stats


def mb_s(stats: dict) -> float:
    return stats["bytes"] / 2**20 / stats["seconds"]


def bench(mode: str, size: float, runs: int, tmp: Path, experiment: type | None) -> None:
    cases = {"stdout to /dev/null": run_devnull, "pipe drained by cat": run_cat,
             "pipe, do-nothing batching reader": run_floor, "kvwatch (spawn + OutputPump)": run_kvwatch}
    if experiment is not None:
        cases["kvwatch, --pump FILE"] = lambda m, s, r: run_kvwatch(m, s, r, experiment)
    results: dict[str, list[dict]] = {name: [] for name in cases}
    for i in range(runs):
        for name, fn in cases.items():
            results[name].append(fn(mode, size, tmp / f"{mode}-{i}-{len(results[name])}.json"))
    base = statistics.median(mb_s(s) for s in results["stdout to /dev/null"])
    lines = results["stdout to /dev/null"][0]["lines"]
    print(f"\nwriter '{mode}': {size:g} MB, {lines:,} lines of {size * 2**20 / lines:.0f} bytes, "
          f"median of {runs} runs")
    for name, runs_ in results.items():
        speed = statistics.median(mb_s(s) for s in runs_)
        extra = ""
        if name.startswith("kvwatch"):
            lost = max(s["lost"] for s in runs_)
            extra = f"  lines lost: {lost}  intact (count, bytes, last line): {all(s['intact'] for s in runs_)}"
        print(f"  {name:<30}{speed:9.1f} MB/s  ratio {speed / base:5.2f}{extra}")
    floor = statistics.median(mb_s(s) for s in results["pipe, do-nothing batching reader"])
    print(f"  the do-nothing batching reader / /dev/null = {floor / base:.2f}: what the pipe alone costs")
    for name in (n for n in results if n.startswith("kvwatch")):
        kv = statistics.median(mb_s(s) for s in results[name])
        print(f"  {name} / /dev/null = {kv / base:.3f} (bar >= {BAR}): {'PASS' if kv / base >= BAR else 'MISS'};"
              f" / do-nothing reader = {kv / floor:.2f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=float, default=200.0, help="MB the child writes (default 200)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mode", choices=(*MODES, "all"), default="all")
    p.add_argument("--pump", metavar="FILE", help="also measure OutputPump from this file (an experiment)")
    args = p.parse_args()
    experiment = None
    if args.pump:
        spec = importlib.util.spec_from_file_location("experimental_pump", args.pump)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        experiment = module.OutputPump
        print(f"also measured: OutputPump from {args.pump}")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES if args.mode == "all" else (args.mode,):
            bench(mode, args.size, args.runs, Path(tmp), experiment)


if __name__ == "__main__":
    main()
