"""docs/hybrid-models.md's count of architectures planned, refused, unknown and draft heads planned with their
target per release is the planner's own verdicts over the generated architecture table, not a hand-kept figure."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, REFUSED, UNKNOWN, verdict
from kvwatch.vllm_releases.architectures import ARCHITECTURES

PAGE = Path(__file__).resolve().parent.parent / "docs" / "hybrid-models.md"
ROW = re.compile(r"^\| (\d+\.\d+\.\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", re.M)


def counts(release: str) -> tuple[int, int, int, int, int]:
    handled = Counter(verdict(name, release).handling for name in ARCHITECTURES[release])
    return len(ARCHITECTURES[release]), handled[PLANNED], handled[REFUSED], handled[UNKNOWN], handled[DRAFT]


def test_the_pages_counts_are_the_planners_verdicts() -> None:
    rows = {m.group(1): tuple(int(m.group(i)) for i in range(2, 7)) for m in ROW.finditer(PAGE.read_text())}
    newest = sorted(ARCHITECTURES, key=lambda r: tuple(int(p) for p in r.split(".")))[-3:]
    assert set(newest) <= set(rows), f"docs/hybrid-models.md lacks rows for {sorted(set(newest) - set(rows))}"
    wrong = {r: (rows[r], counts(r)) for r in rows if rows[r] != counts(r)}
    assert not wrong, f"page vs planner (architectures, planned, refused, unknown, draft): {wrong}"
