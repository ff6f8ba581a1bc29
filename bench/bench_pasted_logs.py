"""How many pasted variants of the fixture logs keep the verdict on the log as printed (issue 41).

Every fixture log (tests/fixtures/logs and field_logs) cut right after the line that names it, re-wrapped at
16 widths from 60 to 200 by a terminal's hard cut and by a page's reflow at spaces, bare, under docker
compose's prefix before the wrap, and under a Markdown quote over Buildkite's pipe after it: the variants
tests/test_pasted_logs.py draws from, all of them. Prints the count that differ, and each log that does.

Run: .venv/bin/python bench/bench_pasted_logs.py
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_pasted_logs import GRID_PREFIXES as PREFIXES  # noqa: E402
from test_pasted_logs import LOGS, WIDTHS, cut_after_evidence, cut_verdict, same, variant  # noqa: E402

from kvwatch.diagnosis import diagnose  # noqa: E402


def main() -> None:
    total, differ = 0, Counter[str]()
    for name in LOGS:
        want = cut_verdict(name, 0.0)
        for width in WIDTHS:
            for page in (False, True):
                for prefix, first in PREFIXES:
                    text = variant(cut_after_evidence(name, 0.0), width, page, prefix, first, False)
                    total += 1
                    if not same(diagnose(text.split("\n")), want):
                        differ[name] += 1
    print(f"{len(LOGS)} logs, {total} variants, {sum(differ.values())} differ from the log as printed")
    for name, n in differ.most_common():
        print(f"  {n:3d}  {name}")


if __name__ == "__main__":
    main()
