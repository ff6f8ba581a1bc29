"""The review report of a vLLM release (scripts/absorb_release.py): what no generator covers.

kvwatch's hand-written rules cite vLLM's source as "vLLM X.Y.Z, vllm/path.py:LINE". For each such
citation the cited line is looked up in the new release: the same line, moved (the same text at
another line), text changed (the text is nowhere in the file), the function around it gone, or the
file gone. The files the rules cite are listed with whether they changed from the release before.
Deterministic: the same sources give the same report, byte for byte.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Generated tables (kvwatch/vllm_releases/generated/): their facts are re-read by their generators.
GENERATED = ROOT / "kvwatch" / "vllm_releases" / "generated"
CITATION = re.compile(r"vLLM (\d+\.\d+\.\d+(?:\.post\d+)?),? `?(vllm/[A-Za-z0-9_/]+\.py):(\d+)")


@dataclass(frozen=True)
class Citation:
    where: str          # kvwatch's file:line that cites
    release: str
    file: str
    line: int


def citations() -> list[Citation]:
    out = []
    for path in sorted((ROOT / "kvwatch").rglob("*.py")):
        if path.is_relative_to(GENERATED):
            continue
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in CITATION.finditer(text):
                out.append(Citation(f"{path.relative_to(ROOT)}:{n}", m[1], m[2], int(m[3])))
    return out


def _lines(path: Path, cache: dict[Path, list[str] | None]) -> list[str] | None:
    if path not in cache:
        cache[path] = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else None
    return cache[path]


def _functions(path: Path, cache: dict[Path, list[tuple[int, int, str]] | None]) -> list[tuple[int, int, str]] | None:
    if path not in cache:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            cache[path] = None
        else:
            cache[path] = [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return cache[path]


def _enclosing(functions: list[tuple[int, int, str]] | None, line: int) -> str | None:
    inside = [f for f in functions or () if f[0] <= line <= f[1]]
    return min(inside, key=lambda f: f[1] - f[0])[2] if inside else None


def _at(lines: list[str] | None, text: str) -> list[int]:
    return [n for n, t in enumerate(lines or (), 1) if t.strip() == text]


def verdict(c: Citation, src: Path, before: str | None, release: str, lines: dict[Path, list[str] | None],
            funcs: dict[Path, list[tuple[int, int, str]] | None]) -> tuple[str, str] | None:
    """(section, what became of the cited line) from the release before to `release`; None when
    nothing did. Sections: "changed" (this release moved, reworded or removed it), "stale" (the
    citation had already drifted before this release), "unreadable"."""
    old = _lines(src / c.release / c.file, lines)
    if old is None or not 0 < c.line <= len(old):
        return "unreadable", f"vLLM {c.release} not unpacked, or the file or line is not in it"
    text = old[c.line - 1].strip()
    prev = _lines(src / before / c.file, lines) if before is not None else None
    new = _lines(src / release / c.file, lines)
    function = _enclosing(_functions(src / c.release / c.file, funcs), c.line)
    prev_functions = {f[2] for f in _functions(src / before / c.file, funcs) or ()} if before is not None else set()
    new_functions = {f[2] for f in _functions(src / release / c.file, funcs) or ()}
    if new is None:
        return ("changed", "file gone") if prev is not None else ("stale", f"file gone before {release}")
    if function is not None and function in prev_functions and function not in new_functions:
        return "changed", f"`{function}` gone"
    if not text or c.release == release:   # a citation of the release itself was written from it
        return None
    prev_at, new_at = _at(prev, text), _at(new, text)
    where = lambda at: ", ".join(f":{n}" for n in at[:4])   # noqa: E731
    if prev_at and prev_at == new_at:
        return None
    if prev_at and not new_at:
        return "changed", f"text changed: `{text[:90]}`" + (f" (in `{function}`)" if function else "")
    if prev_at:
        return "changed", f"moved {where(prev_at)} -> {where(new_at)}"
    state = f"now at {where(new_at)}" if new_at else "text no longer in the file"
    return "stale", f"the cited text had left line {c.line} before {release}: {state}"


def _release_before(release: str) -> str | None:
    from kvwatch.values.versions import parse_version
    from kvwatch.vllm_releases import KNOWN
    before = [v for v in KNOWN if v.parts < parse_version(release).parts]
    return str(max(before)) if before else None


def review(release: str, src: Path) -> str:
    cites = citations()
    lines: dict[Path, list[str] | None] = {}
    funcs: dict[Path, list[tuple[int, int, str]] | None] = {}
    before = _release_before(release)
    found = [(c, v) for c in cites if (v := verdict(c, src, before, release, lines, funcs)) is not None]
    files = sorted({c.file for c in cites})
    out = [f"# vLLM {release}: review of what no generator covers", "",
           "Written by `scripts/absorb_release.py`; do not edit by hand. The generated tables were re-read",
           f"from {release}'s source; what follows is for a maintainer to read: the source lines kvwatch's",
           f"hand-written rules cite, followed from {before} to {release}.", "",
           f"{len(cites)} citations in hand-written modules; {len(cites) - len(found)} hold through {release}."]
    titles = {"changed": f"Changed in {release}: read these", "stale": "Already drifted before this release",
              "unreadable": "Not checked (the cited release is not unpacked)"}
    for section, title in titles.items():
        rows = sorted(((c, v) for c, (sec, v) in found if sec == section),
                      key=lambda r: (r[0].where, r[0].release, r[0].file, r[0].line))
        out += ["", f"## {title} ({len(rows)})", ""]
        if rows:
            out += ["| cited by | cites | what became of it |", "|---|---|---|"]
            out += [f"| `{c.where}` | vLLM {c.release}, `{c.file}:{c.line}` | {v} |" for c, v in rows]
    if before is not None:
        out += ["", f"## Cited files from {before} to {release}", "",
                "The files kvwatch's hand-written rules cite; a changed one may change a rule that no "
                "generator re-reads.", "", f"| file | {before} -> {release} |", "|---|---|"]
        for f in files:
            a, b = _lines(src / before / f, lines), _lines(src / release / f, lines)
            state = "gone" if b is None else "new" if a is None else "unchanged" if a == b else "changed"
            out.append(f"| `{f}` | {state} |")
    return "\n".join(out) + "\n"
