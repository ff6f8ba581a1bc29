#!/usr/bin/env python3
"""Absorb a vLLM release in one command: fetch its wheel, regenerate every table from it, run the
oracles against its own functions, and write a review report of what no generator covers.

    python scripts/absorb_release.py X.Y.Z [--cache DIR] [--check] [--skip-flags]

1. Fetch: `pip download --no-deps vllm==X.Y.Z` into CACHE/wheels (outside the repository; default
   $KVWATCH_VLLM_CACHE, else ~/.cache/kvwatch-vllm) and unpack its `vllm/` package (no binaries) into
   CACHE/src/X.Y.Z; every other release a generator reads is fetched the same way when missing.
2. Add X.Y.Z to kvwatch.vllm_releases.KNOWN (kvwatch/vllm_releases/__init__.py) when it is new.
3. Run every generator (GENERATORS) on CACHE/src, the option table's with --add (only the new
   release's parser is imported, with this interpreter, which needs torch and transformers), and
   record the parser's answers to the corpus (scripts/check_release_parsers.py --record).
4. Run the oracles (scripts/check_release_functions.py --release X.Y.Z --write) and the tests that
   import the release's pure functions (tests/test_release_oracles.py, live with the sources).
5. Write docs/release-reviews/X.Y.Z.md: every source line kvwatch's hand-written rules cite, checked
   in X.Y.Z (moved, text changed, gone, the function gone), and the files they cite that changed
   from the release before.

Re-running it gives the same files byte for byte. --check writes nothing and exits 1 when a table or
the report is not what the sources give. Nothing of vLLM is copied into the repository.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from release_review import review  # noqa: E402

from kvwatch.errors import KvwatchError  # noqa: E402
from kvwatch.values.versions import parse_version  # noqa: E402

INIT = ROOT / "kvwatch" / "vllm_releases" / "__init__.py"
REVIEWS = ROOT / "docs" / "release-reviews"
# Every generator, run on the folder of unpacked releases: (script, its arguments after the folder).
GENERATORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gen_release_defaults.py", ()),
    ("gen_backend_priorities.py", ()),
    ("gen_max_len_rules.py", ()),
    ("gen_metric_names.py", ()),
    ("gen_vllm_texts.py", ()),
    ("gen_vllm_architectures.py", ("--transformers", "{transformers}")),
)
# The oracle tests: they import the release's pure functions where KVWATCH_VLLM_SRC has them.
ORACLE_TESTS = ("tests/test_release_oracles.py", "tests/test_startup_lines_extensible.py")


class AbsorbError(Exception):
    pass


def cache_dir(given: str | None) -> Path:
    path = Path(given or os.environ.get("KVWATCH_VLLM_CACHE") or Path.home() / ".cache" / "kvwatch-vllm")
    if path.resolve().is_relative_to(ROOT):
        raise AbsorbError(f"{path}: the cache must be outside the repository (vLLM's code is never vendored)")
    return path


def fetch(release: str, cache: Path) -> Path:
    """CACHE/src/RELEASE holding the release's unpacked `vllm/` package (fetched when missing)."""
    tree = cache / "src" / release
    if (tree / "vllm").is_dir():
        return tree
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"vllm-{release}-*.whl"))
    if not found:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                               f"vllm=={release}"], capture_output=True, text=True)
        found = sorted(wheels.glob(f"vllm-{release}-*.whl"))
        if done.returncode != 0 or not found:
            raise AbsorbError(f"vllm=={release}: pip download failed: {done.stderr.strip()[-500:]}")
    tmp = tree.with_name(tree.name + ".partial")
    with zipfile.ZipFile(found[0]) as wheel:
        for member in wheel.namelist():
            if member.startswith("vllm/") and not re.search(r"\.so(\.|$)", member):
                wheel.extract(member, tmp)
    tmp.rename(tree)
    return tree


def add_known(release: str) -> bool:
    """Add `release` to KNOWN (kept sorted, one per minor: a newer patch replaces its minor's);
    False when it is there already."""
    text = INIT.read_text(encoding="utf-8")
    block = re.search(r"KNOWN: tuple\[VllmVersion, \.\.\.\] = tuple\(parse_version\(v\) for v in \((.*?)\)\)", text, re.S)
    if block is None:
        raise AbsorbError(f"{INIT.relative_to(ROOT)}: no KNOWN tuple found")
    known = re.findall(r'"([^"]+)"', block.group(1))
    if release in known:
        return False
    minor = parse_version(release).parts[:2]
    kept = [k for k in known if parse_version(k).parts[:2] != minor] + [release]
    kept.sort(key=lambda k: parse_version(k).parts)
    lines, line = [], "    "
    for k in kept:
        item = f'"{k}", '
        if len(line) + len(item) > 105:
            lines.append(line.rstrip())
            line = "    "
        line += item
    lines.append(line.rstrip().rstrip(","))
    new = text[:block.start(1)] + "\n" + "\n".join(lines) + text[block.end(1):]
    INIT.write_text(new, encoding="utf-8")
    return True


def run(argv: list[str], env: dict[str, str] | None = None) -> int:
    print("+ " + " ".join(argv), file=sys.stderr)
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}).returncode


def transformers_dir() -> str:
    import transformers
    return str(Path(transformers.__file__).parent)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("release", help="the vLLM release, X.Y.Z")
    ap.add_argument("--cache", help="where wheels and unpacked sources go (outside the repository)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a table is not current")
    ap.add_argument("--skip-flags", action="store_true",
                    help="leave the option table alone (its parser needs torch and transformers here)")
    args = ap.parse_args(argv)
    try:
        version = parse_version(args.release)
    except KvwatchError as e:
        ap.error(str(e))
    release = str(version)
    try:
        cache = cache_dir(args.cache)
        tree = fetch(release, cache)
        if args.check:
            from kvwatch.vllm_releases import KNOWN
            if version not in KNOWN:
                raise AbsorbError(f"vLLM {release} is not in KNOWN: run without --check to absorb it")
        elif add_known(release):
            print(f"added {release} to {INIT.relative_to(ROOT)}", file=sys.stderr)
        # every release the generators read (KNOWN, and the texts' older releases)
        needed = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'scripts'); "
                                 "from gen_vllm_texts import default_releases; print(' '.join(default_releases()))"],
                                cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if needed.returncode != 0:
            raise AbsorbError(f"cannot list the releases the generators read: {needed.stderr[-500:]}")
        for other in needed.stdout.split():
            fetch(other, cache)
    except AbsorbError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    src = str(cache / "src")
    check = ["--check"] if args.check else []
    failed = []
    for script, extra in GENERATORS:
        extra_args = [a.format(transformers=transformers_dir()) for a in extra]
        if run([sys.executable, f"scripts/{script}", src, *extra_args, *check]) != 0:
            failed.append(script)
    if not args.skip_flags:
        if run([sys.executable, "scripts/gen_vllm_flags.py", "--add", str(tree), *check]) != 0:
            failed.append("gen_vllm_flags.py")
        # the parser's oracle: vLLM's answers to the corpus, recorded for the tests
        if run([sys.executable, "scripts/check_release_parsers.py", str(tree), *([] if args.check else ["--record"])]) != 0:
            failed.append("check_release_parsers.py")
    oracle = [sys.executable, "scripts/check_release_functions.py", src, "--release", release]
    if run(oracle + ([] if args.check else ["--write"])) != 0:
        failed.append("check_release_functions.py")
    if run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ORACLE_TESTS],
           env={"KVWATCH_VLLM_SRC": src, "KVWATCH_ORACLE_RELEASES": release}) != 0:
        failed.append("oracle tests")
    report = review(release, cache / "src")
    out = REVIEWS / f"{release}.md"
    if args.check:
        if not out.exists() or out.read_text(encoding="utf-8") != report:
            failed.append(str(out.relative_to(ROOT)))
    else:
        REVIEWS.mkdir(parents=True, exist_ok=True)
        out.write_text(report, encoding="utf-8")
        print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    if failed:
        print(f"vLLM {release}: not done: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"vLLM {release}: absorbed; review {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
