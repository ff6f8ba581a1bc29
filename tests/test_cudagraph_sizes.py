"""The CUDA graph sizes vLLM captures by default (kvwatch/vllm_releases/cudagraph_sizes.py), against
each release's own _set_cudagraph_sizes run from its source (tests/cudagraph_oracle.py,
KVWATCH_VLLM_SRC=<root>/<version>/vllm/...); and the plan's CUDA graph term, which 0.34's wider grids
on the SM100 family widen and nothing else moves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from vllm_sources import release_tree_or_skip

from kvwatch.planner.devices import CARDS, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.gpu_budget import CUDA_GRAPH_BYTES, forward_pass_bytes
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.release_compare import compare_releases
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.cudagraph_sizes import WIDE_SOURCE, capture_sizes, default_sizes

ORACLE = Path(__file__).parent / "cudagraph_oracle.py"
QWEN2 = json.loads((Path(__file__).parent.parent / "examples/qwen2-7b/config.json").read_text())

# (capability, max_num_seqs, max_num_batched_tokens): the batch defaults of the big cards, small and odd
# batches, limits on either side of 8192 and of the default lists' 512 and 1024
CASES = [((10, 0), 1024, 8192), ((10, 0), 1024, 16384), ((10, 3), 1024, 16384), ((10, 0), 256, 2048),
         ((10, 0), 128, 16384), ((10, 0), 1, 1), ((10, 0), 3, 5), ((10, 0), 2048, 32768), ((10, 0), 5000, 6000),
         ((10, 0), 600, 700), ((9, 0), 1024, 8192), ((9, 0), 5, 8192), ((8, 0), 100, 150), ((12, 0), 512, 4096),
         ((12, 1), 256, 2048), ((8, 9), 1024, 300)]


@cache
def release_sizes(release: str) -> tuple[tuple[int, ...], ...]:
    source = release_tree_or_skip(release, "vllm/config/vllm.py")
    cases = json.dumps([[*cc, seqs, tokens] for cc, seqs, tokens in CASES])
    done = subprocess.run([sys.executable, str(ORACLE), cases], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(source)}, cwd=source)
    if done.returncode != 0 and "No module named 'torch'" in done.stderr:
        pytest.skip("torch is not installed: vLLM's config does not import")
    assert done.returncode == 0, done.stderr[-3000:]
    return tuple(tuple(sizes) for sizes in json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_the_sizes_are_the_ones_the_release_records(release: str) -> None:
    recorded = release_sizes(release)
    for (cc, seqs, tokens), expected in zip(CASES, recorded, strict=True):
        assert capture_sizes(parse_version(release).parts, cc, seqs, tokens).tokens == expected, (cc, seqs, tokens)


def test_only_034_on_the_sm100_family_takes_the_wide_grids() -> None:
    wide = {(cc, release) for cc, _, _ in CASES for release in ((0, 33, 0), (0, 34, 0))
            if capture_sizes(release, cc, 1024, 16384).wide}
    assert wide == {((10, 0), (0, 34, 0)), ((10, 3), (0, 34, 0))}
    assert capture_sizes((0, 34, 0), (10, 0), 1024, 16384, sizes_given=True).tokens == \
        tuple(default_sizes(1024, 16384, sm100=True))
    assert capture_sizes((0, 34, 0), (10, 0), 1024, 16384).source == WIDE_SOURCE


def _plan(release: str, card: str, *flags: str) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags], release).settings()
    return make_plan(geometry_from_config(QWEN2), settings, preset(card), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))


@pytest.mark.parametrize("card", [c.key for c in CARDS if c.capability[0] == 10])
def test_034_widens_the_graph_pool_on_sm100_by_the_widest_graphs_working_set(card: str) -> None:
    plan = _plan("0.34.0", card)
    budget = plan.gpu_budget
    assert budget is not None
    sizes = capture_sizes((0, 34, 0), preset(card).compute_capability, budget.max_num_seqs,
                          budget.max_num_batched_tokens)
    default = default_sizes(budget.max_num_seqs, budget.max_num_batched_tokens, sm100=True)
    count = geometry_from_config(QWEN2).weight_count
    assert count is not None and sizes.largest > default[-1]
    widened = forward_pass_bytes(count, sizes.largest, plan.dtype_bytes, 1) - \
        forward_pass_bytes(count, default[-1], plan.dtype_bytes, 1)
    assert budget.cuda_graph_bytes == CUDA_GRAPH_BYTES + widened > CUDA_GRAPH_BYTES
    assert f"{len(sizes.tokens)} CUDA graph sizes up to {sizes.largest} tokens on SM100 ({WIDE_SOURCE})" in budget.release


@pytest.mark.parametrize("release, card, flags", [
    ("0.33.0", "b200", ()), ("0.32.0", "gb200", ()), ("0.34.0", "h100", ()), ("0.34.0", "rtx-pro-6000", ()),
    ("0.34.0", "b200", ("--max-cudagraph-capture-size", "512")), ("0.34.0", "b200", ("--cudagraph-capture-sizes", "1", "8")),
    ("0.34.0", "b200", ("-cc", '{"max_prefill_cudagraph_capture_tokens": 1024}'))])
def test_elsewhere_the_graph_term_stays_the_measured_one(release: str, card: str, flags: tuple[str, ...]) -> None:
    budget = _plan(release, card, *flags).gpu_budget
    assert budget is not None
    assert budget.cuda_graph_bytes == CUDA_GRAPH_BYTES and "CUDA graph sizes" not in budget.release


def test_eager_mode_captures_no_graph_on_sm100_either() -> None:
    budget = _plan("0.34.0", "b200", "--enforce-eager").gpu_budget
    assert budget is not None and budget.cuda_graph_bytes == 0 and "CUDA graph sizes" not in budget.release


@pytest.mark.parametrize("flags, given", [
    ((), False), (("--cudagraph-capture-sizes", "1", "2"), True), (("--max-cudagraph-capture-size", "64"), True),
    (("--compilation-config", '{"cudagraph_mode": "PIECEWISE"}'), True), (("-cc", '{"level": 3}'), False),
    (("-cc", "3"), False), (("-cc", "{not json"), False)])
def test_the_capture_size_flags_are_read(flags: tuple[str, ...], given: bool) -> None:
    assert EngineCommand.parse(["vllm", "serve", "m", *flags], "0.34.0").settings().cudagraph_sizes_given is given


def test_the_upgrade_check_names_the_wider_grids_as_the_graphs_cause() -> None:
    old, new = _plan("0.33.0", "b200"), _plan("0.34.0", "b200")
    compared = compare_releases(old, new, parse_version("0.33.0"), parse_version("0.34.0"), preset("b200"))
    row = next(d for d in compared.differences if d.field == "cuda_graphs")
    assert old.gpu_budget is not None and new.gpu_budget is not None
    assert (row.a, row.b) == (old.gpu_budget.cuda_graph_bytes, new.gpu_budget.cuda_graph_bytes)
    assert "wider grids on the SM100 family" in row.reason and row.source == WIDE_SOURCE
    on_h100 = compare_releases(_plan("0.33.0", "h100"), _plan("0.34.0", "h100"), parse_version("0.33.0"),
                               parse_version("0.34.0"), preset("h100"))
    assert not any(d.field == "cuda_graphs" for d in on_h100.differences)
