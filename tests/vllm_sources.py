"""Where the tests find an unpacked vLLM release (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...), and the
oracles that run a release's own code from it, or their answers recorded from such a run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest


def release_tree(release: str, needs: str = "vllm") -> Path | None:
    """<root>/<release> where KVWATCH_VLLM_SRC holds the release's `needs` (a path under the tree)."""
    root = os.environ.get("KVWATCH_VLLM_SRC")
    tree = Path(root) / release if root else None
    return tree if tree is not None and (tree / needs).exists() else None


def release_tree_or_skip(release: str, needs: str = "vllm") -> Path:
    """release_tree(), or the test skips saying how to unpack the release."""
    tree = release_tree(release, needs)
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    return tree


def unpacked_root(releases: Iterable[str], needs: str = "vllm") -> Path | None:
    """KVWATCH_VLLM_SRC where it holds every one of `releases` (with `needs`), else None."""
    trees = [release_tree(r, needs) for r in releases]
    return trees[0].parent if trees and all(trees) and trees[0] is not None else None


def oracle_answers(script: Path, release: str, cases: dict[str, dict[str, Any]], record: Path) -> dict[str, Any]:
    """The answers of `script` (run on the unpacked release with the cases as JSON, its last line a JSON
    list, one answer per case) by case name; the answers recorded in `record` where the release is not
    unpacked here."""
    tree = release_tree(release)
    if tree is None:
        return json.loads(record.read_text())[release]   # type: ignore[no-any-return]
    out = subprocess.run([sys.executable, str(script), str(tree), json.dumps(list(cases.values()))],
                         capture_output=True, text=True, timeout=600, check=True)
    return dict(zip(cases, json.loads(out.stdout.strip().splitlines()[-1]), strict=True))
