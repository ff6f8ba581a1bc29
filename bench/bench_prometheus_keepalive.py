"""Kept-alive scrapes by the real Prometheus (Go's HTTP client), before and after one write per answer.

Prometheus keeps its connection to a target open. An answer sent in two writes (headers, then body)
makes every kept-alive scrape wait for Nagle's algorithm and the client's delayed ACK (~40 ms);
Python's http.client does not delay its ACKs that way, so only a Go client shows it. This bench runs
`kvwatch export` (the package under each --root, an earlier commit's for "before") on an engine
stand-in, the real Prometheus (Debian's, `scripts/install-tools.sh`) scraping it every second, and
prints Prometheus' own `scrape_duration_seconds` (median, p90, max) beside a fresh-connection
scraper's median, side by side. Loopback only; about `--seconds` per root.

    .venv/bin/python bench/bench_prometheus_keepalive.py --root /path/to/worktree-before --root .
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_faults  # noqa: E402
from bench_overhead import Engine  # noqa: E402
from prometheus_support import prometheus_server  # noqa: E402


def one_root(root: Path, seconds: float) -> tuple[list[float], float]:
    """Prometheus' scrape durations of kvwatch export run from `root`, and a fresh scraper's median."""
    bench_faults.KVWATCH_ROOT = root
    engine = __import__("http.server").server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    tmp = Path(tempfile.mkdtemp(prefix="bench-keepalive-"))
    proc, port, _ = bench_faults.start_kvwatch(tmp, engine.server_address[1], secure=False)
    try:
        with prometheus_server(tmp / "prom", [f"127.0.0.1:{port}"]) as prom:
            fresh = bench_faults.Scraper(port, None, auth=False, keep_alive=False)
            stop = threading.Event()
            runner = threading.Thread(target=fresh.run, args=(stop, 1.0), daemon=True)
            runner.start()
            time.sleep(seconds)
            stop.set()
            runner.join(10)
            window = f"{int(seconds)}s"
            result = prom.query(f'scrape_duration_seconds{{job="kvwatch"}}[{window}]')
            durations = [float(v) for _, v in result[0]["values"]] if result else []
    finally:
        proc.terminate()
        proc.wait(10)
        engine.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return durations, statistics.median(fresh.times) if fresh.times else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", action="append", required=True, help="a kvwatch tree to run (repeat)")
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    print(f"{'kvwatch from':<40}{'scrapes':>8}{'p50 ms':>9}{'p90 ms':>9}{'max ms':>9}{'fresh p50 ms':>14}"
          f"{'kept/fresh':>11}")
    for root in args.root:
        durations, fresh = one_root(Path(root).resolve(), args.seconds)
        if not durations:
            print(f"{root:<40}  no scrape recorded by Prometheus")
            continue
        durations.sort()
        p50 = statistics.median(durations)
        p90 = durations[int(len(durations) * 0.9) - 1]
        print(f"{str(root)[-40:]:<40}{len(durations):8d}{p50 * 1000:9.2f}{p90 * 1000:9.2f}"
              f"{durations[-1] * 1000:9.2f}{fresh * 1000:14.2f}{p50 / fresh:11.2f}", flush=True)


if __name__ == "__main__":
    main()
