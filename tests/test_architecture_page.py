"""docs/architecture.md stays true: every module of kvwatch is named in a row of its module tables with
its job, every module it names exists, and its picture of the layers is pyproject.toml's contract."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvwatch"
PAGE = ROOT / "docs" / "architecture.md"
_TOKEN = re.compile(r"`([^`\s]+\.py)`")


def modules() -> list[str]:
    """Every module under kvwatch/, as the page spells it (kvwatch/-relative); a package's __init__.py
    only where it holds more than a docstring."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and not _holds_code(path):
            continue
        found.append(rel)
    return found


def _holds_code(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
               and not (isinstance(node, ast.ImportFrom) and node.module == "__future__") for node in body)


def _module(token: str) -> str:
    return token.removeprefix("kvwatch/")


def table_rows() -> dict[str, str]:
    """The modules each row of the page's module tables names in its first cell -> that row's job."""
    rows: dict[str, str] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and line.startswith("| `"):
            for token in _TOKEN.findall(cells[0]):
                rows[_module(token)] = cells[1]
    return rows


def test_every_module_is_named_in_a_row_with_its_job() -> None:
    rows = table_rows()
    missing = [m for m in modules() if m not in rows]
    assert not missing, f"docs/architecture.md names no row for: {', '.join(missing)}"
    assert all(rows[m] for m in modules())


def test_every_module_the_page_names_exists() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    named = {_module(t) for t in _TOKEN.findall(PAGE.read_text(encoding="utf-8"))}
    ours = {m for m in named if m.split("/")[0] in packages or m.startswith("__init__")}
    gone = sorted(m for m in ours if not (PACKAGE / m).is_file())
    assert not gone, f"docs/architecture.md names modules that are not there: {', '.join(gone)}"


def test_every_test_the_page_names_exists() -> None:
    named = {t.removeprefix("tests/") for t in _TOKEN.findall(PAGE.read_text(encoding="utf-8"))
             if t.removeprefix("tests/").startswith("test_")}
    assert named, "the page names no test"
    assert not sorted(t for t in named if not (ROOT / "tests" / t).is_file())


def test_the_picture_of_the_layers_is_the_contract() -> None:
    """Each layer of pyproject.toml's contract on a line of its own, top to bottom, in the picture."""
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    [layers] = [c["layers"] for c in contract["contracts"] if c["type"] == "layers"]
    text = PAGE.read_text(encoding="utf-8")
    picture = text.split("## The layers", 1)[1].split("```")[1].splitlines()
    at = -1
    for layer in layers:
        names = [n.strip() for n in re.split(r"[|:]", layer)]
        lines = [i for i, line in enumerate(picture) if all(re.search(rf"\b{n}\b", line) for n in names)]
        assert lines, f"the picture has no line with {names}"
        assert lines[0] > at, f"{names} drawn above the layer it sits under"
        at = lines[0]


def test_the_checker_sees_a_missing_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row check reads first cells only: a module named in prose, or in a job, is not a row."""
    page = tmp_path / "architecture.md"
    page.write_text("| module | job |\n|---|---|\n| `planner/plan.py` | plans, after `planner/rules.py` |\n"
                    "`planner/units.py` is said in prose.\n")
    monkeypatch.setattr(sys.modules[__name__], "PAGE", page)
    assert table_rows() == {"planner/plan.py": "plans, after `planner/rules.py`"}
