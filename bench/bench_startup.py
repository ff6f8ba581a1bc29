"""Start-up cost of the CLI: `kvwatch --help` and `kvwatch plan`, and proof that neither imports vllm or torch.

Run: .venv/bin/python bench/bench_startup.py [--runs N]
Prints the median wall time of each command next to a bare `python -c pass`, and the ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KIMI = str(ROOT / "examples" / "kimi-k2")
PLAN = ["plan", "--preset", "h200", "--", "vllm", "serve", KIMI, "--kv-cache-memory-bytes", "40G"]
# Runs kvwatch's main() in-process, then reports which heavy modules it imported.
PROBE = ("import sys, json, contextlib, io\n"
         "from kvwatch.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    try:\n        main(json.loads(sys.argv[1]))\n    except SystemExit:\n        pass\n"
         "print(json.dumps(sorted(m for m in ('vllm', 'torch', 'transformers', 'pynvml') if m in sys.modules)))")


def wall(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def heavy_imports(args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    base = wall([sys.executable, "-c", "pass"], runs)
    print(f"python -c pass            {base * 1000:7.1f} ms")
    for label, args in (("kvwatch --help", ["--help"]), ("kvwatch plan (H200, Kimi-K2)", PLAN)):
        t = wall([sys.executable, "-m", "kvwatch.cli", *args], runs)
        heavy = heavy_imports(args)
        print(f"{label:<26}{t * 1000:7.1f} ms  ratio to bare python {t / base:5.2f}  "
              f"heavy imports: {', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()
