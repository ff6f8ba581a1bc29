"""The command line every generator of release data shares: read each release kvwatch knows from
SRC_ROOT/<version>/vllm, render the data file, and write it (or, with --check, fail when the
committed file is not what the sources give)."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvwatch.vllm_releases import KNOWN  # noqa: E402


def generate(description: str, out: Path, read_release: Callable[[Path], Any | None],
             render: Callable[[dict[str, Any]], str], argv: Sequence[str] | None = None) -> int:
    """`read_release(tree)` gives one release's data (None: that release has none); 0 on success,
    1 when --check finds the file stale, 2 when a release is not unpacked."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("src_root", nargs="?", default=os.environ.get("KVWATCH_VLLM_SRC"))
    ap.add_argument("--check", action="store_true", help="fail when the committed file is not current")
    args = ap.parse_args(argv)
    if not args.src_root:
        ap.error("give SRC_ROOT or set KVWATCH_VLLM_SRC")
    rows: dict[str, Any] = {}
    for v in KNOWN:
        tree = Path(args.src_root) / str(v)
        if not (tree / "vllm").is_dir():
            print(f"error: vLLM {v} is not unpacked under {args.src_root}", file=sys.stderr)
            return 2
        found = read_release(tree)
        if found is not None:
            rows[str(v)] = found
    return write_or_check(out, render(rows), args.check, f"{len(rows)} releases")


def write_or_check(out: Path, text: str, check: bool, what: str) -> int:
    """Write the generated file (0), or with `check` compare it with the committed one (1: stale)."""
    if check:
        if out.read_text(encoding="utf-8") != text:
            print(f"{out.relative_to(ROOT)} is not current: run scripts/{Path(sys.argv[0]).name}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}: {what}")
    return 0
