"""scripts/absorb_release.py's parts that run without the network: KNOWN's edit, the cache outside
the repository, bad input, the review of cited lines, and the release data stored as changes."""
from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

from kvwatch.vllm_releases.release_chain import changes_of, expand, expand_fields, field_changes_of

ROOT = Path(__file__).resolve().parent.parent


ABSORB = load_script("absorb_release")
REVIEW = load_script("release_review")


def test_known_gains_a_release_once_and_a_patch_replaces_its_minor(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    init = tmp_path / "__init__.py"
    init.write_text((ROOT / "kvwatch" / "vllm_releases" / "__init__.py").read_text())
    monkeypatch.setattr(ABSORB, "INIT", init)
    assert ABSORB.add_known("0.35.0") is True
    once = init.read_text()
    assert '"0.35.0"' in once and ABSORB.add_known("0.35.0") is False and init.read_text() == once
    assert ABSORB.add_known("0.35.1") is True
    text = init.read_text()
    assert '"0.35.1"' in text and '"0.35.0"' not in text
    namespace: dict[str, object] = {}
    exec(compile(text, str(init), "exec"), namespace)   # still valid Python, sorted
    known = [str(v) for v in namespace["KNOWN"]]   # type: ignore[attr-defined]
    assert known[-1] == "0.35.1" and known == sorted(known, key=lambda v: tuple(map(int, v.split("."))))


def test_the_cache_must_be_outside_the_repository() -> None:
    with pytest.raises(ABSORB.AbsorbError, match="outside the repository"):
        ABSORB.cache_dir(str(ROOT / "wheels"))


def test_a_bad_release_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        ABSORB.main(["banana"])
    assert exit_.value.code == 2 and "banana" in capsys.readouterr().err


def _tree(root: Path, release: str, text: str) -> None:
    path = root / release / "vllm" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text(text)


@pytest.mark.parametrize("new,section,words", [
    ("def f():\n    a = 1\n    return a\n", None, ""),                                   # holds
    ("# one line more\ndef f():\n    a = 1\n    return a\n", "changed", "moved :2 -> :3"),
    ("def f():\n    a = 2\n    return a\n", "changed", "text changed: `a = 1` (in `f`)"),
    ("def g():\n    a = 1\n", "changed", "`f` gone"),
])
def test_the_review_follows_a_cited_line_to_the_new_release(tmp_path: Path, new: str, section: str | None,
                                                           words: str) -> None:
    old = "def f():\n    a = 1\n    return a\n"
    _tree(tmp_path, "0.1.0", old)
    _tree(tmp_path, "0.2.0", old)
    _tree(tmp_path, "0.3.0", new)
    cite = REVIEW.Citation("kvwatch/m.py:1", "0.1.0", "vllm/x.py", 2)
    found = REVIEW.verdict(cite, tmp_path, "0.2.0", "0.3.0", {}, {})
    assert (found is None) if section is None else found == (section, words)


def test_release_data_as_changes_expands_back() -> None:
    tables = {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3, "z": 4}, "c": {"y": 3, "z": 4}}
    base_release, base, changes = changes_of(tables)
    assert changes == {"b": ({"y": 3, "z": 4}, ()), "c": ({}, ("x",))}
    assert expand(base_release, base, changes) == tables
    rows = {"a": {"f": 1, "g": "s"}, "b": {"f": 1, "g": "t"}}
    r, b, c = field_changes_of(rows)
    assert c == {"b": {"g": "t"}} and expand_fields(r, b, c) == rows
