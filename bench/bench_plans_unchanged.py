#!/usr/bin/env python3
"""Are the plans of the recorded corpora the same in two kvwatch trees? (issue 43: a refactor changes no plan)

    .venv/bin/python bench/bench_plans_unchanged.py --before DIR --after DIR

DIR is a tree holding a `kvwatch/` package (e.g. `git archive COMMIT kvwatch | tar -x -C DIR`). Each
tree plans, in a process of its own, every case of the recorded corpora (tests/fixtures/models/kv_truth.json
and tests/fixtures/release_truths/*.json, configs from tests/fixtures/models/corpus.py) as
`kvwatch plan --json` does, on every release both trees know (0.27.0 to 0.34.0) and on four devices (this
CPU, an H100, an RTX PRO 6000, a GB10). It prints how many plans are byte-identical JSON, how many differ
only by keys one tree does not have, and every other difference.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASES = ("0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
DEVICES = (("--device", "cpu"), ("--preset", "h100"), ("--preset", "rtx-pro-6000"), ("--preset", "gb10"))


def cases() -> list[tuple[str, list[str]]]:
    """(corpus model, flags) of every recorded case, once each."""
    files = [ROOT / "tests/fixtures/models/kv_truth.json", *sorted((ROOT / "tests/fixtures/release_truths").glob("*.json"))]
    seen: dict[tuple[str, tuple[str, ...]], None] = {}
    for f in files:
        for case in json.loads(f.read_text())["cases"]:
            seen[(case["model"], tuple(case["flags"]))] = None
    return [(m, list(flags)) for m, flags in seen]


def plan_all(work: Path) -> dict[str, str]:
    """Run inside one tree (its kvwatch first on sys.path): every case's `kvwatch plan --json` output."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.models import corpus

    from kvwatch.cli import main
    out: dict[str, str] = {}
    for model, flags in cases():
        folder = work / model
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(corpus.CORPUS[model]["config"]))
        extra = flags if "--max-model-len" in flags else ["--max-model-len", "2048", *flags]
        for release in RELEASES:
            for device in DEVICES:
                gpu = [] if device[1] == "cpu" else ["--kv-cache-memory-bytes", "8G"]
                buffer = io.StringIO()
                with redirect_stdout(buffer):
                    try:
                        rc = main(["plan", "--json", *device, "--vllm-version", release, "--",
                                   "vllm", "serve", str(folder), *extra, *gpu])
                    except SystemExit as exit_:
                        rc = exit_.code
                out[f"{model} {' '.join(flags)} | {release} | {device[1]}"] = f"rc={rc}\n{buffer.getvalue()}"
    return out


def strip_new_keys(a: object, b: object) -> tuple[object, object]:
    """Both values with the dict keys only one of them has dropped, recursively."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = a.keys() & b.keys()
        pairs = {k: strip_new_keys(a[k], b[k]) for k in keys}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = [strip_new_keys(x, y) for x, y in zip(a, b, strict=True)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    return a, b


def parsed(text: str) -> tuple[str, object]:
    head, _, body = text.partition("\n")
    try:
        return head, json.loads(body)
    except ValueError:
        return head, body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path)
    parser.add_argument("--after", required=True, type=Path)
    parser.add_argument("--_plan", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    results = {}
    for name, tree in (("before", args.before), ("after", args.after)):
        with tempfile.TemporaryDirectory() as scratch:   # the same model path in both trees' plans
            work = str(Path(scratch).parent / "kvwatch-plans-unchanged")
            code = (f"import sys, json; sys.path.insert(0, {str(tree.resolve())!r}); "
                    f"sys.path.insert(1, {str(ROOT / 'bench')!r}); import bench_plans_unchanged as b; "
                    f"from pathlib import Path; print(json.dumps(b.plan_all(Path({work!r}))))")
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 env={"VLLM_CPU_KVCACHE_SPACE": "4", "PATH": "/usr/bin:/bin"})
            results[name] = json.loads(run.stdout.strip().splitlines()[-1])
            shutil.rmtree(work, ignore_errors=True)
    before, after = results["before"], results["after"]
    same = new_keys_only = 0
    different = []
    for key in sorted(before.keys() & after.keys()):
        if before[key] == after[key]:
            same += 1
            continue
        (rc_a, a), (rc_b, b) = parsed(before[key]), parsed(after[key])
        if rc_a == rc_b and strip_new_keys(a, b)[0] == strip_new_keys(a, b)[1]:
            new_keys_only += 1
        else:
            different.append(key)
    print(f"plans: {len(before.keys() & after.keys())} ({len(cases())} recorded cases x {len(RELEASES)} releases "
          f"x {len(DEVICES)} devices)")
    print(f"{'release':10} {'byte-identical':>15} {'but new keys':>13} {'different':>10}")
    for release in RELEASES:
        keys = [k for k in before.keys() & after.keys() if f"| {release} |" in k]
        diff = sum(1 for k in keys if k in different)
        ident = sum(1 for k in keys if before[k] == after[k])
        print(f"{release:10} {ident:15} {len(keys) - ident - diff:13} {diff:10}")
    print(f"{'all':10} {same:15} {new_keys_only:13} {len(different):10}")
    for key in different[:40]:
        print(f"    {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
