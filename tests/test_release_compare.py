"""The upgrade check (`kvwatch plan --compare-version`): two releases' plans, each difference with
its reason and source (kvwatch/planner/release_compare.py, kvwatch/commands/plan.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.boundary.plan_loader import plan_command
from kvwatch.cli import main
from kvwatch.planner.devices import PRESETS
from kvwatch.planner.release_compare import compare_releases, render_comparison
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import KNOWN

QWEN = str(Path(__file__).resolve().parent.parent / "examples" / "qwen2-7b")


def compare(device_name: str, a: str, b: str, *flags: str):  # type: ignore[no-untyped-def]
    device = PRESETS[device_name]
    argv = ["vllm", "serve", QWEN, *flags]
    va, vb = parse_version(a), parse_version(b)
    plan_a = plan_command(argv, device, ruleset_for(a), env={}, vllm_version=va)
    plan_b = plan_command(argv, device, ruleset_for(b), env={}, vllm_version=vb)
    return plan_a, plan_b, compare_releases(plan_a, plan_b, va, vb, device)


def by_field(comparison):  # type: ignore[no-untyped-def]
    return {d.field: d for d in comparison.differences}


def test_0_19_to_0_20_on_h100_utilization_and_cuda_graphs() -> None:
    a, b, c = compare("h100", "0.19.1", "0.20.2")
    rows = by_field(c)
    assert (rows["utilization"].a, rows["utilization"].b) == (0.9, 0.92)
    assert "vLLM 0.20.2, vllm/config/cache.py:66" in rows["utilization"].source
    assert rows["cuda_graphs"].a == 0 and rows["cuda_graphs"].b > 0
    assert "vLLM 0.20.2, vllm/envs.py:1737" in rows["cuda_graphs"].source
    assert rows["num_blocks"].a == a.num_blocks and rows["num_blocks"].b == b.num_blocks != a.num_blocks
    assert rows["num_blocks"].reason == "follows from utilization, cuda_graphs"


def test_0_27_to_0_28_on_b200_batch_tier() -> None:
    # 256 requests: the forward pass, not the sampler over 1024 requests x the vocabulary (which the
    # 16384-token pass of a 7B model does not outgrow), sets the activation peak, so it follows the tier.
    _, _, c = compare("b200", "0.27.1", "0.28.0", "--max-num-seqs", "256")
    rows = by_field(c)
    assert (rows["max_num_batched_tokens"].a, rows["max_num_batched_tokens"].b) == (8192, 16384)
    assert "vLLM 0.28.0, vllm/engine/arg_utils.py:2582" in rows["max_num_batched_tokens"].source
    assert rows["activation_peak"].b > rows["activation_peak"].a
    assert "utilization" not in rows and "cuda_graphs" not in rows


def test_a_flag_given_hides_the_default_change() -> None:
    _, _, c = compare("b200", "0.27.1", "0.28.0", "--max-num-batched-tokens", "8192")
    assert c.differences == ()
    assert "no difference" in render_comparison(c)


def test_an_unknown_release_is_planned_as_the_nearest_and_says_so() -> None:
    _, _, c = compare("h100", "0.32.0", "0.40.1")
    newest = str(max(KNOWN))
    assert c.used_b == newest and f"planned as {newest}" in c.notes[0]


def test_cli_side_by_side_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--preset", "h100", "--vllm-version", "0.19.1", "--compare-version", "0.20.2",
                 "--", "vllm", "serve", QWEN])
    out = capsys.readouterr().out
    assert code == 0
    assert "vLLM 0.19.1" in out and "vLLM 0.20.2" in out and "vLLM 0.20.2, vllm/config/cache.py:66" in out
    main(["plan", "--preset", "h100", "--vllm-version", "0.19.1", "--compare-version", "0.20.2", "--json",
          "--", "vllm", "serve", QWEN])
    data = json.loads(capsys.readouterr().out)
    assert data["a"]["gpu_budget"]["utilization"] == 0.9 and data["b"]["gpu_budget"]["utilization"] == 0.92
    assert {d["field"] for d in data["comparison"]["differences"]} >= {"utilization", "cuda_graphs", "num_blocks"}


def test_cli_bad_compare_version_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--preset", "h100", "--compare-version", "banana", "--", "vllm", "serve", QWEN])
    err = capsys.readouterr().err
    assert code != 0 and "banana" in err and "Traceback" not in err


# Flags that change meaning between two releases, read from each release's parser data
# (vllm_releases/generated/flags.py): (flags, A, B, the row's a, b, words of its reason, its source).
FLAG_MEANING = [
    # a switch that gained an inverse (0.33's EnableDisableAction)
    (["--enable-prefix-caching"], "0.32.0", "0.33.0", "on", "on", "adds the inverse --disable-prefix-caching",
     "vLLM 0.33.0, vllm/engine/arg_utils.py:1401"),
    # the inverse, on the release that does not have it
    (["--disable-prefix-caching"], "0.33.0", "0.32.0", "--enable-prefix-caching off", "unknown",
     "vLLM 0.32.0 has no such option", "vLLM 0.33.0, vllm/engine/arg_utils.py:1401"),
    # a prefix unique in 0.32, ambiguous in 0.33
    (["--enable-ch"], "0.32.0", "0.33.0", "--enable-chunked-prefill", "ambiguous",
     "could match --enable-chunked-mm-input, --enable-chunked-prefill", "vLLM 0.33.0, vllm/entrypoints/common/cli_args.py:431"),
    # a prefix unknown in 0.32 that 0.33 reads as a switch turned off
    (["--disable-prefix"], "0.32.0", "0.33.0", "unknown", "--enable-prefix-caching off",
     "reads it as --enable-prefix-caching off", "vLLM 0.33.0, vllm/engine/arg_utils.py:1401"),
    # an option removed (vLLM 0.18.1 dropped --swap-space)
    (["--swap-space", "4"], "0.17.1", "0.18.1", "--swap-space", "unknown", "vLLM 0.18.1 has no such option", "vLLM 0.10.2,"),
    # choices: none any more, one lost, one gained
    (["--kv-cache-dtype", "fp8"], "0.32.0", "0.33.0", "fp8", "fp8", "checks no choices",
     "vLLM 0.33.0, vllm/engine/arg_utils.py:1397"),
    (["--spec-method", "medusa"], "0.32.0", "0.33.0", "medusa", "medusa", "refuses 'medusa': invalid choice",
     "vLLM 0.33.0, vllm/engine/arg_utils.py:1869"),
    (["--block-size", "256"], "0.10.2", "0.11.2", "256", "256", "choices gained 256", "vLLM 0.11.2, vllm/engine/arg_utils.py:901"),
]


@pytest.mark.parametrize(("flags", "a", "b", "cell_a", "cell_b", "reason", "source"), FLAG_MEANING)
def test_flags_that_change_meaning(flags: list[str], a: str, b: str, cell_a: str, cell_b: str, reason: str,
                                   source: str) -> None:
    from kvwatch.planner.release_compare import flag_meaning_rows
    rows = flag_meaning_rows(["vllm", "serve", "m", "--max-model-len", "4096", *flags], a, b)
    assert len(rows) == 1, rows   # --max-model-len means the same in both
    row = rows[0]
    assert (row.field, row.a, row.b) == (f"flag {flags[0]}", cell_a, cell_b)
    assert reason in row.reason and row.source.startswith(source)


def test_flags_with_the_same_meaning_give_no_row() -> None:
    from kvwatch.planner.release_compare import flag_meaning_rows
    argv = ["vllm", "serve", "m", "--max-model-len", "4096", "-tp", "2", "--gpu-memory-utilization=0.8"]
    assert flag_meaning_rows(argv, "0.32.0", "0.33.0") == []


def test_compare_lists_flag_rows_and_b_refusing_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """0.32 -> 0.33 with a prefix 0.33 finds ambiguous: no plan for 0.33, the flag rows and its refusal, exit 3."""
    rc = main(["plan", "--preset", "h100", "--vllm-version", "0.32.0", "--compare-version", "0.33.0", "--",
               "vllm", "serve", QWEN, "--enable-prefix-caching", "--enable-ch"])
    out = capsys.readouterr().out
    assert rc == 3
    assert "flag --enable-ch" in out and "ambiguous" in out
    assert "adds the inverse --disable-prefix-caching" in out
    assert "refusal command_line" in out and "vLLM 0.33.0 refuses this command line" in out


def test_compare_exits_3_when_b_refuses_an_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--preset", "h100", "--vllm-version", "0.33.0", "--compare-version", "0.32.0", "--",
               "vllm", "serve", QWEN, "--disable-prefix-caching"])
    out = capsys.readouterr().out
    assert rc == 3
    assert "FAILS: [vllm_parser] vLLM 0.32.0's `vllm serve` parser refuses the command" in out
