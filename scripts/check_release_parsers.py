"""The oracle: each vLLM release's own `vllm serve` parser against kvwatch's reading of the same commands.

For every release given (unpacked wheels, or the installed vLLM), imports that release's parser on
this CPU (scripts/vllm_release_parser.py, one process per release), parses each command line of the
corpus (tests/fixtures/vllm_parsers/corpus.json: inverses, prefixes, ambiguous prefixes, choices,
`--max-model-len auto`, the usual flags) and compares vLLM's answer (the settings kvwatch reads, or
the refusal) with kvwatch's (kvwatch.planner.engine_args, for the release kvwatch.vllm_releases
resolves it to). Any difference fails, naming the release, the input and both answers.

    .venv/bin/python scripts/check_release_parsers.py --src SRC            # every release unpacked in SRC
    .venv/bin/python scripts/check_release_parsers.py SRC/0.33.0 --installed
    .venv/bin/python scripts/check_release_parsers.py --src SRC --record   # write vLLM's answers as the fixture

--record writes tests/fixtures/vllm_parsers/answers.json, which tests/test_engine_args_releases.py
reads, so CI checks every release without importing any.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvwatch.errors import KvwatchError  # noqa: E402
from kvwatch.planner.engine_args import EngineCommand  # noqa: E402
from kvwatch.values.versions import parse_version  # noqa: E402
from kvwatch.vllm_releases import resolve  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "vllm_parsers"
CORPUS = FIXTURES / "corpus.json"
ANSWERS = FIXTURES / "answers.json"
READER = ROOT / "scripts" / "vllm_release_parser.py"

# vLLM's dest -> kvwatch's EngineSettings field. max_model_len also covers max_model_len_auto (-1).
FIELDS = {"block_size": "block_size", "kv_cache_dtype": "kv_cache_dtype", "dtype": "dtype",
          "gpu_memory_utilization": "gpu_memory_utilization", "kv_cache_memory_bytes": "kv_cache_memory_bytes",
          "max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs",
          "max_num_batched_tokens": "max_num_batched_tokens", "enable_chunked_prefill": "enable_chunked_prefill",
          "tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
          "data_parallel_size": "data_parallel_size", "num_gpu_blocks_override": "num_gpu_blocks_override",
          "attention_backend": "attention_backend", "host": "host", "port": "port",
          "disable_hybrid_kv_cache_manager": "disable_hybrid_kv_cache_manager",
          "enable_prefix_caching": "enable_prefix_caching", "mamba_cache_dtype": "mamba_cache_dtype",
          "mamba_ssm_cache_dtype": "mamba_ssm_cache_dtype", "enforce_eager": "enforce_eager"}
# Settings kvwatch keeps as a plain bool: vLLM's None (unset) and False both read as off.
_PLAIN_BOOLS = ("disable_hybrid_kv_cache_manager", "enforce_eager")


def error_kind(message: str) -> str:
    """The kind of a refusal, from argparse's words (vLLM's) or kvwatch's."""
    for pattern, kind in ((r"ambiguous option", "ambiguous"), (r"expected (one|at least one) argument",
                          "expected argument"), (r"ignored explicit argument", "ignored explicit argument"),
                          (r"invalid choice", "invalid choice"), (r"unrecognized arguments", "unrecognized")):
        if re.search(pattern, message):
            return kind
    return "invalid value"


def vllm_answer(raw: dict[str, Any]) -> dict[str, Any]:
    """vLLM's answer as compared: the refusal's kind (and an ambiguity's candidates), or the settings."""
    if "error" in raw:
        out: dict[str, Any] = {"refused": error_kind(raw["error"])}
        found = re.search(r"could match (.*)$", raw["error"])
        if found:
            out["candidates"] = sorted(s.strip() for s in found[1].split(","))
        return out
    values = {}
    for dest, value in raw["values"].items():
        if dest not in FIELDS or (dest in _PLAIN_BOOLS and not value):
            continue
        values[dest] = "auto" if dest == "max_model_len" and value == -1 else value
    return {"values": values}


def kvwatch_answer(words: list[str], release: str) -> dict[str, Any]:
    """kvwatch's answer for `vllm serve WORDS` read as `release` (a release of kvwatch's table)."""
    command = EngineCommand(("vllm", "serve", *words), release)
    refusal = command.refusal()
    if refusal is not None:
        out: dict[str, Any] = {"refused": refusal.complaint}
        found = re.search(r"could match (.*)$", refusal.message)
        if found:
            out["candidates"] = sorted(s.strip() for s in found[1].split(","))
        return out
    try:
        settings = command.settings()
    except KvwatchError as exc:   # kvwatch.errors: every bad-input error (CommandError among them)
        return {"refused": error_kind(str(exc))}
    baseline = EngineCommand(("vllm", "serve", words[0]), release).settings()
    values: dict[str, Any] = {}
    for dest, name in FIELDS.items():
        ours = getattr(settings, name)
        if dest == "max_model_len" and settings.max_model_len_auto:
            values[dest] = "auto"
        elif ours != getattr(baseline, name):
            values[dest] = ours
    return {"values": values}


def differences(release: str, corpus: list[list[str]], raw_answers: list[dict[str, Any]]) -> list[str]:
    """One line per corpus entry where kvwatch's reading differs from the release's parser."""
    used = str(resolve(parse_version(release)).used)
    out = []
    for words, raw in zip(corpus, raw_answers, strict=True):
        theirs, ours = vllm_answer(raw), kvwatch_answer(words, used)
        if theirs != ours:
            out.append(f"vLLM {release}: vllm serve {' '.join(words)}\n  vLLM:    {json.dumps(theirs)}\n"
                       f"  kvwatch: {json.dumps(ours)} (read as {used})")
    return out


def _stable(value: Any) -> Any:
    """vLLM's answers with the addresses some of its messages print (`<function loads at 0x7f...>`,
    0.34) made constant, so recording a release again gives the same file."""
    if isinstance(value, str):
        return re.sub(r" at 0x[0-9a-f]+>", " at 0x...>", value)
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items()}
    return value


def ask_vllm(where: list[str], python: str, keep: Path | None) -> dict[str, Any]:
    """The release's report (its options and its answers to the corpus), saved under `keep` if given."""
    done = subprocess.run([python, str(READER), *where, "--corpus", str(CORPUS)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(where)}: the release's parser did not import:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        name = report["release"].split("+")[0] if where[0] == "--installed" else Path(where[1]).name
        (keep / f"{name}{'-installed' if where[0] == '--installed' else ''}.json").write_text(done.stdout)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*", type=Path, help="unpacked wheels, one folder (holding vllm/) per release")
    ap.add_argument("--src", type=Path, help="a folder of unpacked wheels, one sub-folder per release")
    ap.add_argument("--installed", action="store_true", help="also the vLLM installed in --python")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that imports vLLM (has torch)")
    ap.add_argument("--min", default="0.10", help="the oldest release under --src (default 0.10)")
    ap.add_argument("--reports", type=Path, help="also save each release's report there (gen_vllm_flags.py "
                                                  "--reports reads them)")
    ap.add_argument("--from-reports", type=Path, help="compare the reports saved there instead of importing")
    ap.add_argument("--record", action="store_true", help=f"write vLLM's answers to {ANSWERS.relative_to(ROOT)}")
    args = ap.parse_args()
    trees = list(args.trees)
    if args.src:
        trees += [p for p in args.src.iterdir() if (p / "vllm").is_dir()
                  and parse_version(p.name).parts >= parse_version(args.min).parts]
    wheres = [["--tree", str(t.resolve())] for t in sorted(trees, key=lambda p: parse_version(p.name).parts)]
    wheres += [["--installed"]] if args.installed else []
    if not wheres and not args.from_reports:
        ap.error("no release given: name unpacked wheels, --src FOLDER or --installed")
    corpus = json.loads(CORPUS.read_text())
    recorded = json.loads(ANSWERS.read_text()) if ANSWERS.exists() else {}
    if args.from_reports:
        reports = [json.loads(p.read_text()) for p in sorted(args.from_reports.glob("*.json"))]
    else:   # every release asked first: a failing comparison must not cost the (slow) imports
        reports = [ask_vllm(where, args.python, args.reports) for where in wheres]
    failed = 0
    for report in reports:
        release = report["release"].split("+")[0]
        found = differences(release, corpus, report["results"])
        failed += len(found)
        print(f"vLLM {release} ({report['module']}): {len(corpus)} command lines, {len(found)} differences")
        for line in found:
            print(line)
        recorded[release] = {"parser": report["module"], "python": report["python"],
                             "answers": _stable(report["results"])}
    if args.record:
        ordered = dict(sorted(recorded.items(), key=lambda kv: parse_version(kv[0]).parts))
        ANSWERS.write_text(json.dumps(ordered, indent=1, sort_keys=False) + "\n")
        print(f"{ANSWERS.relative_to(ROOT)}: {len(ordered)} releases")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
