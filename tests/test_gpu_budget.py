"""vLLM's GPU memory budget before launch (kvwatch/planner/gpu_budget.py), against real GPU logs."""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from gpu_log_corpus import (
    FIT,
    HELD_OUT,
    GiB,
    Summary,
    all_runs,
    drawn_split,
    logged_kv_bytes,
    per_source_summary,
    plan_run,
    residual_terms,
    source_of_url,
    source_split,
    started_runs,
    within_interval,
)

from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import CARDS, PRESETS, Device, card_for, cuda_total_bytes, preset, unified_memory_bytes
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.gpu_budget import (
    CUDA_GRAPH_BYTES,
    FUSED_SAMPLER_BYTES,
    SORTED_SAMPLER_BYTES,
    TRITON_SAMPLER_BYTES,
    V0_ENGINE,
    batch_defaults,
    estimate_budget,
    moe_workspace_bytes,
    offloaded_bytes,
    profile_key,
    profile_sampler_bytes,
    release_for,
    replicated_extra_bytes,
    requested_bytes,
)
from kvwatch.planner.non_torch import (
    NON_TORCH_BYTES,
    NON_TORCH_ONE_GPU_BYTES,
    NON_TORCH_TP_BYTES,
    NON_TORCH_TP_EXTRA_BYTES,
    NVLINK_TP2_BYTES,
    non_torch_bytes,
)
from kvwatch.planner.weights import WeightCount, count_weights, weights_bytes
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import DEFAULT_RELEASE, resolve
from kvwatch.vllm_releases.kv_layout import mla_entry_elements
from kvwatch.vllm_releases.model_runner_v2 import penalty_state_bytes, runs_v2_runner

A100 = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB)
H100 = PRESETS["h100"]

V0_32 = parse_version("0.32.0")   # the figures below are 0.32's


def settings(*flags: str):  # type: ignore[no-untyped-def]
    return EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()


@pytest.mark.parametrize("text, parts", [("0.10.1.1", (0, 10, 1)), ("0.6.5.dev12+gabc", (0, 6, 5)),
                                          ("v0.32.0", (0, 32, 0)), ("0.19", (0, 19, 0)), ("0.7.3rc1", (0, 7, 3))])
def test_versions_as_vllm_prints_them(text: str, parts: tuple[int, int, int]) -> None:
    assert parse_version(text).parts == parts


@pytest.mark.parametrize("text", ["banana", "", "1", "0.x", "9" * 50])
def test_a_version_that_is_none_is_one_error(text: str) -> None:
    with pytest.raises(KvwatchError, match="vLLM version"):
        parse_version(text)


def test_each_release_line_profiles_as_its_code_did() -> None:
    v = parse_version
    assert release_for(v("0.6.5")).engine == V0_ENGINE
    assert release_for(v("0.10.1")).sampler_bytes == FUSED_SAMPLER_BYTES          # FlashInfer sampler
    assert release_for(v("0.12.0")).sampler_bytes == SORTED_SAMPLER_BYTES          # FlashInfer off (#26859)
    assert release_for(v("0.19.0")).sampler_bytes == TRITON_SAMPLER_BYTES         # Triton top-k/top-p
    assert not release_for(v("0.19.0")).cuda_graphs_counted
    assert release_for(v("0.21.0")).cuda_graphs_counted
    assert release_for(None) == release_for(DEFAULT_RELEASE)   # one default release (vllm_releases)
    assert release_for(None).defaults.release == str(DEFAULT_RELEASE) == str(resolve(None).used)
    assert release_for(v("0.10.1")).default_utilization == 0.9
    assert release_for(V0_32).default_utilization == 0.92                          # config/cache.py of 0.32
    # the environment the engine gets decides as vLLM's envs.py does
    assert release_for(v("0.8.5"), {"VLLM_USE_V1": "0"}).engine == V0_ENGINE
    assert release_for(v("0.12.0"), {"VLLM_USE_FLASHINFER_SAMPLER": "1"}).sampler_bytes == FUSED_SAMPLER_BYTES
    assert not release_for(v("0.32.0"), {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}).cuda_graphs_counted


def test_scheduler_defaults_by_card_as_get_batch_defaults() -> None:
    r = release_for(V0_32)
    assert batch_defaults(settings(), A100, r, 8192) == (2048, 256)       # A100s keep the small defaults
    assert batch_defaults(settings(), H100, r, 8192) == (8192, 1024)
    assert batch_defaults(settings(), PRESETS["b200"], r, 8192) == (16384, 1024)
    assert batch_defaults(settings("--max-num-seqs", "8"), H100, r, 8192) == (8192, 8)
    v0 = release_for(parse_version("0.6.5"))
    assert batch_defaults(settings(), H100, v0, 8192) == (8192, 256)      # V0: max(max_model_len, 2048)
    assert batch_defaults(settings(), H100, v0, 131072) == (2048, 256)    # chunked prefill above 32K


def test_the_cuda_total_is_below_nvmls() -> None:
    assert cuda_total_bytes(A100) == int(79.15 * GiB)
    assert cuda_total_bytes(H100) == int(79.18 * GiB)
    logged = replace(A100, cuda_total_bytes=int(79.25 * GiB))
    assert cuda_total_bytes(logged) == int(79.25 * GiB)
    unknown = Device("cuda", "NVIDIA Future GPU", (12, 0), 100 * GiB)
    assert 99 * GiB < cuda_total_bytes(unknown) < 100 * GiB
    mig = Device("cuda", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", (8, 0), 40 * GiB)   # not the whole card
    assert cuda_total_bytes(mig) < 40 * GiB


def test_the_utilization_vllm_defaults_to_is_the_versions() -> None:
    old, new = parse_version("0.10.1"), V0_32
    total = int(79.15 * GiB)
    assert requested_bytes(A100, settings(), old) == int(total * 0.9)
    assert requested_bytes(A100, settings(), new) == int(total * 0.92)
    assert requested_bytes(A100, settings("--gpu-memory-utilization", "0.5"), old) == int(total * 0.5)


def test_gpt_oss_keeps_its_attention_in_bf16() -> None:
    """MXFP4 quantizes the experts only: modules_to_not_convert names self_attn (gpt-oss config.json)."""
    cfg = {"hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
           "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
           "vocab_size": 201088}
    plain = weights_bytes({**cfg, "quantization_config": {"quant_method": "mxfp4"}}, 2)
    skipped = weights_bytes({**cfg, "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}}, 2)
    count = count_weights(cfg)
    assert plain is not None and skipped is not None and count is not None
    assert skipped - plain == int(count.attention_params * (2 - (0.5 + 1 / 32)))
    assert count.mlp_width_per_token == 4 * 2880      # a token passes through its 4 experts


def test_a_learned_profile_is_keyed_by_what_changes_the_profile_run() -> None:
    base = profile_key(settings("--port", "1"), H100, V0_32)
    assert profile_key(settings("--port", "2", "--gpu-memory-utilization", "0.5"), H100, V0_32) == base
    assert profile_key(settings("--max-num-seqs", "64"), H100, V0_32) != base
    assert profile_key(settings(), A100, V0_32) != base
    assert profile_key(settings(), H100, parse_version("0.10.1")) != base


RUNS = started_runs()


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_every_real_start_up_is_planned_with_a_kv_cache(run: dict, tmp_path: Path) -> None:
    """No plan of zero KV where vLLM started, and every plan's budget adds up."""
    plan = plan_run(run, tmp_path / "model")
    budget = plan.gpu_budget
    assert budget is not None and plan.source == "estimated"
    assert plan.kv_memory_bytes == budget.kv_cache_bytes > 0
    assert budget.requested_bytes == budget.non_kv_bytes + budget.kv_cache_bytes


def _errors(runs: list[dict], tmp_path: Path) -> list[float]:
    return [(plan_run(r, tmp_path / r["name"]).kv_memory_bytes - logged_kv_bytes(r)) / logged_kv_bytes(r)
            for r in runs]


def test_the_pre_launch_kv_memory_is_within_3_percent_at_the_median(tmp_path: Path) -> None:
    """The issue's measure on the whole corpus (bench/bench_gpu_budget.py prints the table)."""
    errors = _errors(RUNS, tmp_path)
    assert len(errors) >= 40
    assert statistics.median(abs(e) for e in errors) <= 0.03


def test_the_held_out_third_is_within_3_percent_at_the_median(tmp_path: Path) -> None:
    """Issue 27: the runs no term was fitted on, apart. The figures hold what bench/bench_gpu_budget.py
    printed on the corpus (BENCHMARKS.md section 12), so a change that loses them fails here: 58
    held-out runs, median 0.8 %, 78 % within 3 %, mean 3.6 %; outside the llm-d sweep (one lab's 0.19.0
    H100 runs, whose fit half measured two terms) 38 runs, median 1.5 %, 66 % within 3 % (the issue's
    bar is 70 %). The bounds moved from 43 runs / 86 % and 23 runs / 74 % when 28 public start-ups
    were added (section 12.4), not when a term changed: the added held-out runs are further off.
    Section 12.7 tightened them (76 % -> 78 %, mean 4.7 % -> 3.6 %; outside the sweep 1.7 % -> 1.5 %,
    63 % -> 66 %): V0's rank 0 samples and sets the executor's minimum at tensor parallel (Qwen3-30B-A3B
    at TP 4, +34.5 % -> +1.2 %; DeepSeek-R1 at TP 8, +78 % -> +66 %), then V0 0.7.x's absorbed MLA
    matrices (DeepSeek-R1 +66 % -> +45 %, DeepSeek-Coder-V2-Lite TP 8 +8.3 % -> +7.5 %); phi's two-matrix MLP
    (-11.3 % -> +9.9 %, a miss still: V0 0.6.4 counts the CUDA context as non-torch memory).
    Section 12.8 tightened the share within 3 % (78 % -> 81 %; outside the sweep 66 % -> 71 %, the bar
    met) and the means (3.6 % -> 3.2 %, 5.2 % -> 4.7 %). On the way the median bound was loosened to 1.0 %
    for one commit (the rotary cache brought every Llama 3.1 run's weights to the logged figure, and the
    runs just below the median, already under the logged KV memory, moved further under), then set back
    to 0.8 % when the MoE routers, whole on every rank, took it to 0.76 %.
    Section 12.9 added public start-ups by the same draw, not a term: the two that fell in the held-out
    set (Qwen3-4B-Instruct-2507 on an RTX 5090, vLLM 0.29, +5.5 %; Llama-3.1-8B on an A100, 0.31.0,
    +1.2 %) moved the bounds to 60 runs, median 0.9 %, 76.7 % within 3 % (40 runs, 65 % outside the
    sweep); the mean is unchanged. The two passes merged (12.8's terms on 12.9's corpus): 60 runs,
    median 0.9 %, 80 % within, mean 3.2 %; outside the sweep 40 runs, 1.4 %, 70 % within, mean 4.6 %.
    Section 12.10 (the V2 runner's penalty state, charged from 0.27) tightened the median 0.87 -> 0.76 %
    and the means (3.21 -> 3.01 %; outside the sweep 4.65 -> 4.35 %), and loosened the median outside
    the sweep 1.44 -> 1.88 %: the two held-out runs that sat at it (Qwen2.5-0.5B serve on 0.27.1,
    Llama-3.1-8B at 1,024 requests on 0.31.0) were already under the logged KV memory, kvwatch's V2
    activation being above the logged one (0.25 and 1.44 GiB logged against 1.05 and 2.37 planned), and
    the term moved them 0.8-0.9 point further under (-1.9 -> -2.7 %, -1.4 -> -2.3 %), inside 3 % still.
    Section 12.14 added two held-out runs, not a term (Qwen3.6-35B-A3B NVFP4 on an RTX 5090, vLLM 0.24.0,
    -9.6 % and -10.0 % once their MIXED_PRECISION layers are read as vLLM reads them): 62 runs, median
    0.85 %, 77 % within, mean 3.2 %; outside the sweep 42 runs, 2.3 %, 67 % within, mean 4.5 %.
    Section 12.15 (draw 8: 39 more public start-ups, 17 of them held out by this draw, most of the llm-d
    sweep's later records; with them Qwen3.5's --language-model-only, Nemotron-H's blocks, Gemma 3's class
    vocabulary and Llama 4's shared expert, each read from the release's code): 79 runs, median 0.70 %,
    78 % within, mean 3.3 %; outside the sweep 46 runs, 2.1 %, 67 % within, mean 4.8 % (the L40S TP 4
    Qwen2.5-72B run, -30.9 %, and Llama 4 Scout, +15.8 %, hold the means up).
    Section 12.16 (draws 9 and 10: 49 more public start-ups, 24 of them held out by this draw; with them the
    0.18 one-GPU non-torch figure and the rotary caches as get_rope builds them): 103 runs, median 0.65 %,
    76 % within, mean 4.1 %; outside the sweep 70 runs, 1.8 %, 67 % within, mean 5.6 % (DeepSeek-V2.5 at
    TP 8 x PP 2 across two nodes, +78 %, and the Qwen3-32B TP 2 run on PCIe RTX PRO 6000 cards, -43.6 %,
    hold the means up).
    Section 12.17 (draw 11: 30 more public start-ups, 20 of them held out by this draw; with them NCCL's
    memory at tensor parallel by interconnect and release, the fused-MoE workspaces of quantized experts on
    the Triton and Marlin kernels, MXFP4 padding on the SM100 family and under --moe-backend marlin, and
    bitsandbytes' skip list): 123 runs, median 0.75 %, 80 % within, mean 2.7 %; outside the sweep 90 runs,
    1.2 %, 74 % within, mean 3.3 % (the draw's new held-out runs alone had moved the median to 0.9 %).
    Section 12.18 (draw 12: 57 more public start-ups, 26 of them held out by this draw, among them three
    Nemotron-3-Nano LoRA runs 48-66 % off, the LoRA profile unsized; with them the V2 runner's own default
    rules from 0.22 and its missing graph estimate, VLLM_MXFP4_USE_MARLIN, the windows' in-flight batches
    before 0.26 and the LoRA slots from 0.8): 149 runs, median 0.92 %, 79.9 % within, mean 3.8 %; outside
    the sweep 116 runs, 1.19 %, 75.9 % within, mean 4.6 % (under stop 50's tree the same runs give 1.0 % and
    77 % within)."""
    held = started_runs(HELD_OUT)
    summary = Summary.of(_errors(held, tmp_path))
    assert summary.runs >= 149
    assert summary.median <= 0.0092
    assert summary.within >= 0.798
    assert summary.mean <= 0.0379
    outside = [r for r in held if not r.get("batch")]
    apart = Summary.of(_errors(outside, tmp_path))
    assert apart.runs >= 116
    assert apart.median <= 0.0120
    assert apart.within >= 0.758
    assert apart.mean <= 0.0458


def test_the_held_out_kv_tokens_are_within_3_percent_at_the_median(tmp_path: Path) -> None:
    held = [r for r in started_runs(HELD_OUT) if r["logged"].get("kv_cache_tokens")]
    errors = [(plan_run(r, tmp_path / r["name"]).kv_cache_tokens - r["logged"]["kv_cache_tokens"])
              / r["logged"]["kv_cache_tokens"] for r in held]
    assert len(errors) >= 10
    assert Summary.of(errors).median <= 0.03


def test_the_hybrids_kv_tokens_are_within_3_percent_on_all_runs(tmp_path: Path) -> None:
    """Issue 27's 'the same for KV tokens, hybrids included': the runs with a recurrent state (Mamba,
    linear attention) beside attention, on all runs (one is held out). BENCHMARKS 12.12: 3 runs, median
    2.6 %, all within 3 % (the two Qwen3.5-0.8B runs were +3.1 % and +4.3 % before the V1 encoder pass).
    BENCHMARKS 12.14 added two held-out Qwen3.6-35B-A3B NVFP4 runs (RTX 5090): -9.7 % and -10.0 % as planned,
    the KV memory's miss (given the logged KV memory their tokens are the logged ones): 5 runs, median 2.6 %,
    3 of 5 within 3 %. Draw 8 added the two Qwen3.5 runs (-1.9 % and -0.4 %) and Nemotron-3-Nano on a GB10
    (+4.5 %, a zero-KV plan until Nemotron-H was counted block by block): 8 runs, median 2.6 %, 5 of 8 within.
    Draws 9-12 brought 17 runs, median 2.7 %, 10 of 17 within: the three Nemotron-3-Nano LoRA runs of draw 12
    (+48 to +66 %: the LoRA profile is not sized) and the two Qwen3.5-0.8B A100 runs (+2.7 / +2.9 %) are out."""
    errors = []
    for run in started_runs():
        if not run["logged"].get("kv_cache_tokens"):
            continue
        plan = plan_run(run, tmp_path / run["name"])
        if plan.recurrent_state_bytes > 0:
            errors.append((plan.kv_cache_tokens - run["logged"]["kv_cache_tokens"]) / run["logged"]["kv_cache_tokens"])
    summary = Summary.of(errors)
    assert summary.runs >= 17
    assert summary.median <= 0.03 and summary.within >= 0.58


def test_the_split_is_the_one_drawn_and_never_holds_out_a_run_tuned_to() -> None:
    runs = all_runs()
    assert {r["name"]: r["split"] for r in runs} == drawn_split(runs)
    assert not any(r["tuned_before_issue_27"] for r in runs if r["split"] == HELD_OUT)
    started = started_runs()
    assert len(started_runs(HELD_OUT)) >= len(started) // 4 and len(started_runs(FIT)) > len(started) // 2


def test_every_run_names_its_source_and_a_joined_one_says_why() -> None:
    """Issue 38: the source of a run is the repository, thread, site or stored file its `source_url`
    names; a run whose source names another file joins that run's source only with a `source_why`
    (the README's provenance: the same author, box or host)."""
    for run in all_runs():
        if run["source"] != source_of_url(run["source_url"]):
            assert run.get("source_why"), run["name"]
            assert any(r["source"] == run["source"] and r["name"] in run["source_why"] for r in all_runs()), run["name"]
    assert source_of_url("https://github.com/vllm-project/vllm/issues/10517") == "github.com/vllm-project/vllm#10517"
    assert source_of_url("github.com/igabhix001/Finetuning_LLama") == "github.com/igabhix001/Finetuning_LLama"
    assert source_of_url("public GitHub file, search-index file id 7884883735 (no repository)") == "search-index file 7884883735"
    with pytest.raises(ValueError):
        source_of_url("a blog")


def test_the_source_split_holds_out_whole_sources_and_never_one_tuned_to() -> None:
    """No source on both sides; a source of a run tuned to before issue 27 is fit; an added run of a
    new source moves no other run; at least a quarter of the started runs' sources are held out (counted
    by source, as the split draws: one lab's sweep of 70 runs is one source, fit)."""
    runs = all_runs()
    split = source_split(runs)
    sides: dict[str, set[str]] = {}
    for run in runs:
        sides.setdefault(run["source"], set()).add(split[run["name"]])
    assert all(len(s) == 1 for s in sides.values()), [k for k, s in sides.items() if len(s) > 1]
    assert not any(r["tuned_before_issue_27"] for r in runs if split[r["name"]] == HELD_OUT)
    added = {**runs[-1], "name": "added_run", "source": "search-index file 1", "tuned_before_issue_27": False}
    assert {k: v for k, v in source_split([*runs, added]).items() if k != "added_run"} == split
    started = started_runs()
    held = [r for r in started if split[r["name"]] == HELD_OUT]
    sources = {r["source"] for r in started}
    assert len({r["source"] for r in held}) >= max(20, len(sources) // 4)
    # the by-run split holds sources out in part: the reason for the source split
    assert any(len({r["split"] for r in runs if r["source"] == s}) > 1 for s in sides)


def test_the_source_held_out_runs_hold_the_published_figure(tmp_path: Path) -> None:
    """Issue 38: the figure the README, docs and BENCHMARKS.md quote (section 12.13), printed by
    bench/bench_gpu_budget.py: the whole sources held out, 35 runs, median |error| 1.5 % (1.9 % before the
    quantized weights were sized from their quantization_config, planner/quant_layout.py), 77 % within
    3 % (74 % before), no zero-KV plan (the issue's bar is 2 % and 80 %: the share is not met). Of them,
    the 19 the by-run split held out too (never fitted on): median 2.6 %, 68 % within.
    Section 12.14 added a new held-out source (club-3090: Qwen3.6-35B-A3B NVFP4 on an RTX 5090, vLLM 0.24.0,
    two runs). As first planned both were zero-KV plans (its ModelOpt MIXED_PRECISION layers read as bf16);
    read as vLLM resolves their prefixes (planner/quant_layout.py _mixed_entry) they are -9.6 % and -10.0 %:
    37 runs, median 1.87 %, 73 % within 3 %, no zero-KV plan; never fitted on: 21 runs, 2.6 %, 62 %.
    Draw 8 added two Qwen3.5 start-ups whose config.json a later search found (a new term came with neither):
    Qwen3.5-4B on an RTX 4090 D (0.23.0, held out, -1.9 %) and Qwen3.5-9B on an RTX 5090 (0.21.0, fit by
    source; -8.2 % until --language-model-only was read, planner/tower_skip.py, -0.4 % since): 38 runs,
    median 1.88 %, 74 % within 3 %; never fitted on: 22 runs, 2.6 %, 64 %.
    The third search pass of draw 8 added two held-out sources: Qwen3-0.6B on an RTX 3060 (0.19.0, +0.5 %)
    and Qwen2.5-72B at TP 4 on four L40S (0.19.0, -30.9 %: the 2 GiB of NCCL memory measured on H100s at TP
    is charged to PCIe cards too; not changed, since only this held-out run would show it): 40 runs,
    median 1.88 %, 72.5 % within 3 %, no zero-KV plan; never fitted on: 23 runs, 2.6 %, 61 %.
    Section 12.16: five search passes of draws 9 and 10 (run before any term changed, every usable run
    added) brought 25 held-out runs from 13 new held-out sources; under stop 47's tree the held-out set is
    65 runs, 1.5 %, 74 % within. Three readings found on fit runs (one GPU's non-torch memory from 0.18,
    0.25 GiB; the rotary width in rope_parameters; Gemma 3's class length and second cache) make it 65
    runs, median 1.30 %, 73.8 % within 3 %, no zero-KV plan; never fitted on: 35 runs, 1.83 %, 69 %.
    Section 12.17: four search passes of draw 11 (every usable run added) brought 17 held-out runs from 9 new
    held-out sources; under stop 48's tree the held-out set is 82 runs, 1.4 %, 70 % within (the PCIe L20 runs
    at TP 2-8, -6 to -33 %, charged NVLink's NCCL memory). The terms of 12.17 (NCCL's memory by interconnect
    and release, quantized experts' kept workspaces, MXFP4 tile padding, bitsandbytes' skip list) make it 82
    runs, median 0.97 %, 80.5 % within 3 %, no zero-KV plan; never fitted on: 47 runs, 0.98 %, 77 %.
    Section 12.18: four search passes of draw 12 (every usable run added) brought 29 held-out runs from 8
    new held-out sources; under stop 50's tree the held-out set is 111 runs, 1.0 %, 77 % within (85 of 111).
    The terms of 12.18, each read from the release's code (the V2 runner's default rules from 0.22 and its
    missing graph estimate; VLLM_MXFP4_USE_MARLIN; the windows' in-flight batches before 0.26; the LoRA
    slots from 0.8), leave it at 111 runs, median 0.97 %, 76.6 % within 3 % (85 of 111), no zero-KV plan;
    never fitted on: 58 runs, 1.22 %, 71 %. The bar's 80 % is not met."""
    split = source_split(all_runs())
    held = [r for r in RUNS if split[r["name"]] == HELD_OUT]
    summary = Summary.of(_errors(held, tmp_path))
    assert summary.runs >= 111
    assert summary.median <= 0.0098
    assert summary.within >= 0.765
    assert all(e > -1 for e in _errors(held, tmp_path))   # no zero-KV plan where vLLM started
    clean = Summary.of(_errors([r for r in held if r["split"] == HELD_OUT], tmp_path))
    assert clean.runs >= 58 and clean.median <= 0.0123 and clean.within >= 0.706


def test_the_residual_terms_add_up_to_the_error(tmp_path: Path) -> None:
    for run in RUNS:
        budget = plan_run(run, tmp_path / run["name"]).gpu_budget
        assert budget is not None
        terms = residual_terms(run, budget)
        assert sum(terms.values()) == pytest.approx(budget.kv_cache_bytes / GiB - run["logged"]["available_kv_cache_gib"])


def test_cpu_offload_keeps_its_gib_of_weights_per_gpu_off_the_card() -> None:
    """--cpu-offload-gb is GiB per GPU (config/offload.py); the KV cache gets what it frees."""
    kept = estimate_budget(settings("--cpu-offload-gb", "12"), A100, None, 15 * GiB, 2, 8192, V0_32)
    plain = estimate_budget(settings(), A100, None, 15 * GiB, 2, 8192, V0_32)
    assert plain.weights_bytes - kept.weights_bytes == 12 * GiB
    assert kept.kv_cache_bytes - plain.kv_cache_bytes == 12 * GiB
    assert estimate_budget(settings("--cpu-offload-gb", "40"), A100, None, 15 * GiB, 2, 8192, V0_32).weights_bytes == 0
    with pytest.raises(KvwatchError, match="cpu-offload-gb"):
        settings("--cpu-offload-gb", "-1")


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_v0_charges_the_samplers_peak_at_any_tensor_parallel(tp: int) -> None:
    """V0's rank 0 gathers the logits and samples, and the executor keeps the fewest blocks any rank
    found: rank 0's (vLLM 0.8.5.post1, executor/executor_base.py:103-105). Qwen3-30B-A3B at TP 4 on
    22 GB cards (search_qwen3_30b_a3b_4x22gb_tp4_yarn_v085, V0) logged 1.39 GiB of activation: 256 sorted
    requests x 151,936 vocabulary entries."""
    count = count_weights({"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                           "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                           "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                           "vocab_size": 151936})
    assert count is not None
    budget = estimate_budget(settings("--tensor-parallel-size", str(tp)), A100, count, 15 * GiB, 2, 8192,
                             parse_version("0.8.5.post1"), {"VLLM_USE_V1": "0"})
    assert budget.activation_peak_bytes == int(256 * 151936 * SORTED_SAMPLER_BYTES)
    assert budget.activation_peak_bytes / GiB == pytest.approx(1.39, abs=0.02)


@pytest.mark.parametrize(("version", "platform", "env", "elements"), [
    ("0.7.1", "cuda", {}, 576), ("0.7.2", "cuda", {}, 640), ("0.7.3", "cuda", {}, 640),
    ("0.7.3", "cuda", {"VLLM_CUDA_MEM_ALIGN_KV_CACHE": "0"}, 576), ("0.7.3", "cpu", {}, 576),
    ("0.8.0", "cuda", {}, 576), ("0.19.0", "cuda", {}, 576),
])
def test_v0_pads_the_mla_latent_to_256_bytes_from_072_to_08(version: str, platform: str, env: dict,
                                                            elements: int) -> None:
    """vLLM 0.7.2, vllm/worker/cache_engine.py:131-160: 576 bf16 elements round up to 640."""
    assert mla_entry_elements(576, 2, parse_version(version), platform, env) == elements


@pytest.mark.parametrize("name", ["search_deepseek_r1_8xh200_tp8_v07",
                                  "search_deepseek_coder_v2_lite_l40s_offload30_v072"])
def test_the_07_mla_runs_hold_the_tokens_their_logged_kv_memory_holds(name: str, tmp_path: Path) -> None:
    run = next(r for r in all_runs() if r["name"] == name)
    tokens = plan_run(run, tmp_path / name, logged_kv=True).kv_cache_tokens
    assert tokens == pytest.approx(run["logged"]["kv_cache_tokens"], rel=0.005)


def test_cpu_offload_keeps_the_embeddings_on_the_card() -> None:
    """vLLM offloads only the decoder layers (make_layers): DeepSeek-Coder-V2-Lite with 30 GiB
    offloaded keeps its embeddings and LM head (102,400 x 2,048 x 2 in bf16) and the rotary cache (163,840
    positions x 64 in bf16, vllm_releases/rope_cache.py), as its L40S start-up logged
    (search_deepseek_coder_v2_lite_l40s_offload30_v072: "Loading model weights took 0.80 GB")."""
    run = next(r for r in all_runs() if r["name"] == "search_deepseek_coder_v2_lite_l40s_offload30_v072")
    cfg = run["model_config"]
    count, weights = count_weights(cfg), weights_bytes(cfg, 2)
    assert count is not None and weights is not None
    kept = estimate_budget(settings("--cpu-offload-gb", "30"), A100, count, weights, 2, 8192, V0_32)
    assert kept.weights_bytes == 102400 * 2048 * 2 * 2 + 163840 * 64 * 2
    assert kept.weights_bytes / GiB == pytest.approx(run["logged"]["model_weights_gib"], abs=0.03)


# Two layers of 400 bytes, each parameters of 100, 100 and 200 in module order.
_TWO_LAYERS = WeightCount(linear_params=800, embedding_params=0, num_layers=2, layer_params=(1, 1, 2))


@pytest.mark.parametrize(("budget", "moved"), [
    (400, 400),   # a whole layer: the next one finds the budget reached
    (401, 500),   # one byte over: the next whole parameter goes too
    (450, 500),
    (600, 600),
    (601, 800),   # the last parameter, the biggest, goes whole
    (5000, 800),  # no more than the layers hold
])
def test_cpu_offload_moves_whole_parameters_until_the_budget_is_reached(budget: int, moved: int) -> None:
    assert offloaded_bytes(800, budget, _TWO_LAYERS) == moved


def test_every_card_of_the_table_says_where_its_totals_are_from() -> None:
    assert len(CARDS) >= 20 and len({c.key for c in CARDS}) == len(CARDS)
    for card in CARDS:
        assert card.source and card.total_bytes > 0
        assert card_for(card.name) == card, card.key     # a card's own name finds it, not a look-alike
        assert preset(card.key).compute_capability == card.capability
    for name, key in (("NVIDIA GH200 480GB", "gh200"), ("NVIDIA H20", "h20"), ("NVIDIA L4", "l4"),
                      ("NVIDIA L40S", "l40s"), ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA H100 PCIe", "h100-pcie"),
                      ("NVIDIA GB200", "gb200"), ("Tesla T4", "t4"), ("NVIDIA A100-SXM4-40GB", "a100-40g")):
        card = card_for(name)
        assert card is not None and card.key == key, name
    assert card_for("NVIDIA Future GPU") is None


def test_a_unified_memory_card_has_its_cuda_total_and_no_nvml_one() -> None:
    gb10 = card_for("NVIDIA GB10")
    assert gb10 is not None and gb10.unified_memory and gb10.nvml_mib is None
    assert unified_memory_bytes("NVIDIA GB10") == int(121.69 * GiB) == cuda_total_bytes(preset("gb10"))
    assert unified_memory_bytes("NVIDIA H100 80GB HBM3") is None


@pytest.mark.parametrize("version,installed,expected", [
    ("0.10.1", None, SORTED_SAMPLER_BYTES),     # unknown: pip's default, the wheel names FlashInfer only as an extra
    ("0.12.0", None, SORTED_SAMPLER_BYTES),     # unknown, FlashInfer required by the wheel: off by default anyway
    ("0.10.1", True, FUSED_SAMPLER_BYTES),
    ("0.10.1", False, SORTED_SAMPLER_BYTES),    # a pip install of 0.10 without the flashinfer extra sorts
    ("0.12.0", True, SORTED_SAMPLER_BYTES),     # FlashInfer sampling off by default from 0.11.1
    ("0.19.0", False, TRITON_SAMPLER_BYTES),    # vLLM's own Triton kernel needs no FlashInfer
    ("0.6.5", False, SORTED_SAMPLER_BYTES),     # V0 always sorted
])
def test_the_profile_sorts_where_flashinfer_is_missing(version: str, installed: bool | None, expected: float) -> None:
    assert profile_sampler_bytes(release_for(parse_version(version)), installed) == expected


def test_a_hybrid_models_tokens_are_reported_as_its_release_logs_them(tmp_path: Path) -> None:
    """gpt-oss (sliding + full attention, two KV cache groups) on vLLM 0.10.1.1: the log's 2,640,144
    tokens are num_blocks // groups x block size; the same plan for 0.20+ reports concurrency x
    max_model_len (kv_cache_utils.py of each release)."""
    run = next(r for r in all_runs() if r["name"] == "dl_gpt_oss_120b_a100_80g_tp4_u08")
    old = plan_run(run, tmp_path / "old", logged_kv=True)
    assert old.kv_cache_groups == 2
    assert old.kv_cache_tokens == old.num_blocks // 2 * old.block_size
    assert abs(old.kv_cache_tokens - run["logged"]["kv_cache_tokens"]) / run["logged"]["kv_cache_tokens"] < 0.003
    new = plan_run({**run, "vllm_version": "0.20.2"}, tmp_path / "new", logged_kv=True)
    assert new.num_blocks == old.num_blocks and new.kv_cache_tokens > 1.5 * old.kv_cache_tokens


FAILED = [r for r in all_runs() if r["status"].startswith("failed")
          and (r["model_config"].get("num_hidden_layers") or (r["model_config"].get("text_config") or {}))]
# A run whose corpus entry names a planner miss the release's code explains (`known_planner_miss`) is
# expected to fail until that term is planned; strict, so the fix shows as an unexpected pass.
_FAILED_PARAMS = [pytest.param(r, id=r["name"], marks=pytest.mark.xfail(strict=True, reason=r["known_planner_miss"]))
                  if r.get("known_planner_miss") else pytest.param(r, id=r["name"]) for r in FAILED]


@pytest.mark.parametrize("run", _FAILED_PARAMS)
def test_a_start_up_that_failed_for_memory_is_planned_to_fail_the_same_way(run: dict, tmp_path: Path) -> None:
    """A negative KV budget is a plan of no KV memory; a KV cache too small for max_model_len, that."""
    plan = plan_run(run, tmp_path / "model")
    kinds = {w.kind.value for w in plan.warnings}
    if run["logged"]["available_kv_cache_gib"] < 0:
        assert plan.kv_memory_bytes == 0 and "no_kv_cache_memory" in kinds
    else:
        assert "kv_cache_too_small" in kinds


def test_a_unified_memory_card_gets_the_small_scheduler_defaults() -> None:
    """vLLM reads the total for its batch defaults from NVML, which has none on a GB10: the small tier
    (a DGX Spark log shows max_num_batched_tokens=2048 with 121.69 GiB of CUDA memory)."""
    r = release_for(parse_version("0.13.0"))
    assert batch_defaults(settings(), preset("gb10"), r, 32768) == (2048, 256)
    assert batch_defaults(settings(), PRESETS["h200"], r, 32768) == (8192, 1024)


@pytest.mark.parametrize("gpu,cc,tp,version,expected", [
    ("NVIDIA H100 80GB HBM3", (9, 0), 1, "0.17.1", NON_TORCH_BYTES),
    ("NVIDIA H100 80GB HBM3", (9, 0), 1, "0.18.0", NON_TORCH_ONE_GPU_BYTES),   # measured from 0.18
    ("NVIDIA H100 80GB HBM3", (9, 0), 1, "0.19.0", NON_TORCH_ONE_GPU_BYTES),
    ("NVIDIA H100 80GB HBM3", (9, 0), 2, "0.19.0", NON_TORCH_TP_BYTES),     # NCCL over NVLink, measured
    ("NVIDIA H100 80GB HBM3", (9, 0), 2, "0.11.0", NVLINK_TP2_BYTES),       # before 0.19, two NVLink peers
    ("NVIDIA H100 80GB HBM3", (9, 0), 4, "0.10.0", NON_TORCH_TP_BYTES),     # four or more
    ("NVIDIA A100-SXM4-40GB", (8, 0), 8, "0.7.1", NON_TORCH_TP_BYTES),    # SXM in the NVML name
    ("NVIDIA B200", (10, 0), 8, "0.13.0", NON_TORCH_TP_BYTES),
    ("NVIDIA H100 80GB HBM3", (9, 0), 2, "0.30.0", NON_TORCH_ONE_GPU_BYTES + NON_TORCH_TP_EXTRA_BYTES),   # from 0.30
    # PCIe: the one-GPU figure and NCCL's few channels
    ("NVIDIA A100 80GB PCIe", (8, 0), 2, "0.19.0", NON_TORCH_ONE_GPU_BYTES + NON_TORCH_TP_EXTRA_BYTES),
    ("NVIDIA H100 PCIe", (9, 0), 2, "0.19.0", NON_TORCH_ONE_GPU_BYTES + NON_TORCH_TP_EXTRA_BYTES),
    ("NVIDIA H200 NVL", (9, 0), 2, "0.19.0", NON_TORCH_ONE_GPU_BYTES + NON_TORCH_TP_EXTRA_BYTES),
    ("NVIDIA RTX PRO 6000 Blackwell", (12, 0), 4, "0.27.1", NON_TORCH_ONE_GPU_BYTES + NON_TORCH_TP_EXTRA_BYTES),
    ("NVIDIA L40S", (8, 9), 4, "0.19.0", NON_TORCH_ONE_GPU_BYTES + NON_TORCH_TP_EXTRA_BYTES),
    ("NVIDIA L40S", (8, 9), 2, "0.16.0", NON_TORCH_BYTES + NON_TORCH_TP_EXTRA_BYTES),
])
def test_the_non_torch_memory_follows_the_card_and_tensor_parallel(gpu: str, cc: tuple[int, int], tp: int,
                                                                    version: str, expected: int) -> None:
    device = Device("cuda", gpu, cc, 80 * GiB)
    assert non_torch_bytes(device, tp, parse_version(version)) == expected


@pytest.mark.parametrize("config,tp,expected_elements", [
    # Qwen3-30B-A3B: top-8 of 768-wide experts, hidden 2048: (max(768, 2048) + max(1536, 2048)) per routed token
    ({"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
      "head_dim": 128, "vocab_size": 151936, "intermediate_size": 6144, "moe_intermediate_size": 768,
      "num_experts": 128, "num_experts_per_tok": 8}, 1, 8192 * 8 * (2048 + 2048)),
    # Mixtral 8x7B at TP 2: each rank holds half of every expert's 14336 width
    ({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "vocab_size": 32000, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}, 2,
     8192 * 2 * (7168 + 14336)),
    # a dense model keeps none
    ({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 128256,
      "intermediate_size": 14336}, 1, 0),
])
def test_the_fused_moe_workspaces_follow_the_experts_shapes(config: dict, tp: int, expected_elements: int) -> None:
    assert moe_workspace_bytes(count_weights(config), 8192, 2, tp) == expected_elements * 2


def test_the_moe_workspaces_count_from_014_and_not_for_quantized_experts() -> None:
    config = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "vocab_size": 151936, "intermediate_size": 6144, "moe_intermediate_size": 768,
              "num_experts": 128, "num_experts_per_tok": 8}
    count = count_weights(config)
    settings = EngineCommand.parse(["vllm", "serve", "m", "--max-num-batched-tokens", "8192"]).settings()
    h100 = Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB)

    def activation(version: str, quantized: bool = False) -> int:
        return estimate_budget(settings, h100, count, 0, 2, 8192, parse_version(version),
                               experts_without_workspace=quantized).activation_peak_bytes
    workspace = moe_workspace_bytes(count, 8192, 2, 1)
    assert activation("0.19.0") - activation("0.19.0", quantized=True) == workspace
    assert activation("0.13.0", quantized=True) == activation("0.13.0")


@pytest.mark.parametrize("flags, shards", [
    (["-tp", "4"], 4),                                  # each rank a quarter of every expert's width
    (["-tp", "4", "--enable-expert-parallel"], 1),      # FusedMoEParallelConfig.make: use_ep, tp_size=1
    (["--enable-expert-parallel"], 1),                  # one rank: no EP, nothing split either
    (["-tp", "2", "--enable-expert-parallel", "--no-enable-expert-parallel"], 2),
])
def test_expert_parallelism_keeps_whole_experts_on_each_rank(flags: list[str], shards: int) -> None:
    from kvwatch.planner.gpu_budget import expert_width_shards
    assert expert_width_shards(EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()) == shards


def test_an_expert_parallel_rank_keeps_whole_width_workspaces() -> None:
    """Mixtral at TP 4 on 0.19: with --enable-expert-parallel the workspaces are those of full-width
    experts (a rank owns two whole experts rather than a quarter of all eight)."""
    config = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 32000, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}
    count = count_weights(config)
    h100 = Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB)

    def activation(*flags: str) -> int:
        settings = EngineCommand.parse(["vllm", "serve", "m", "--max-num-batched-tokens", "8192", *flags]).settings()
        return estimate_budget(settings, h100, count, 0, 2, 8192, parse_version("0.19.0")).activation_peak_bytes
    assert (activation("-tp", "4", "--enable-expert-parallel") - activation("-tp", "4")
            == moe_workspace_bytes(count, 8192, 2, 1) - moe_workspace_bytes(count, 8192, 2, 4))


def test_deepseek_r1_on_07_loads_its_absorbed_mla_matrices(tmp_path: Path) -> None:
    """search_deepseek_r1_8xh200_tp8_v07 logged 83.88 GiB of weights per rank; the checkpoint's own
    FP8 tensors are 78.3 GiB: V0 0.7.x's absorbed MLA matrices are 4.5 GiB of the rest."""
    run = next(r for r in all_runs() if r["name"] == "search_deepseek_r1_8xh200_tp8_v07")
    budget = plan_run(run, tmp_path / run["name"]).gpu_budget
    assert budget is not None
    assert abs(budget.weights_bytes / GiB - run["logged"]["model_weights_gib"]) < 1.2


@pytest.mark.parametrize(("name", "within_gib"), [
    ("search_qwen3_vl_30b_a3b_h100nvl_v0130", 0.03),   # M-RoPE's 1M-position cache, 3 deepstack buffers (0.37 GiB off before)
    ("search_qwen3_vl_30b_a3b_4x3090_v0110", 0.035),   # the same at TP 4: the cache is whole on each rank (0.31 before)
    ("search_qwen3_next_80b_a3b_2xh200_v0102", 0.01),  # gated delta nets and gated attention, routers whole (0.67 before)
    ("search_qwen3_235b_a22b_fp8_4xrtxpro6000_tp4_v0271", 0.03),   # bf16 routers whole on each rank (0.10 before)
    ("search_qwen3_235b_a22b_fp8_8xl40s_tp8_ep_v0102", 0.06),      # the same at TP 8 (0.14 before)
    ("search_deepseek_coder_v2_lite_8xa100_40g_tp8_v071", 0.03),   # MLA's kv_a_proj whole on each rank (0.07 before)
    ("search_deepseek_r1_8xh200_tp8_v07", 0.15),   # and q_a_proj, FP8, beside the routers (1.08 before)
    ("llmd_llama31_8b_h100", 0.005),                   # Llama 3.1's 32 MiB cache (0.033 before)
    ("llmdacc_llama31_8b_fp32_h100_v0190", 0.005),     # in float32, 64 MiB (0.066 before)
])
def test_the_planned_weights_hold_what_the_loader_allocates_beside_the_checkpoint(name: str, within_gib: float,
                                                                                 tmp_path: Path) -> None:
    """vLLM's "Model loading took" counts the rotary cache and the model files' buffers with the
    tensors (vllm_releases/rope_cache.py), and every tensor-parallel rank holds the MoE routers (whole,
    unquantized) and MLA's replicated projections whole (weights.WeightCount.router_params,
    replicated_linear_params); each of these runs logs its weights."""
    run = next(r for r in RUNS if r["name"] == name)
    budget = plan_run(run, tmp_path / "model").gpu_budget
    assert budget is not None
    assert abs(run["logged"]["model_weights_gib"] - budget.weights_bytes / GiB) <= within_gib


@pytest.mark.parametrize(("tp", "pp", "linear", "extra"), [
    (1, 1, 0, 0),                        # one rank holds everything already
    (2, 1, 0, 1000 * 2 // 2),            # each rank: the whole 2,000 bytes of routers, its even share was 1,000
    (8, 1, 0, 2000 - 2000 // 8),
    (4, 2, 0, 1000 - 1000 // 4),         # a stage holds half the layers' routers
    (8, 1, 800, 2800 - 2800 // 8),       # MLA's replicated projections beside them
])
def test_every_tensor_parallel_rank_keeps_routers_and_mla_projections_whole(tp: int, pp: int, linear: int,
                                                                           extra: int) -> None:
    count = WeightCount(linear_params=10_000, embedding_params=0, router_params=1000)
    assert replicated_extra_bytes(count, tp, pp, 2, linear) == extra


@pytest.mark.parametrize("version, architectures, moe, hybrid, env, v2", [
    ("0.21.0", ("Qwen3ForCausalLM",), False, False, None, False),       # only where the variable asks
    ("0.21.0", ("Qwen3ForCausalLM",), False, False, "1", True),
    ("0.22.0", ("Qwen3ForCausalLM",), False, False, None, True),        # the one listed architecture
    ("0.22.0", ("LlamaForCausalLM",), False, False, None, False),
    ("0.23.0", ("LlamaForCausalLM",), False, False, None, True),
    ("0.23.0", ("Qwen2ForCausalLM",), False, False, None, False),       # dense, not listed
    ("0.24.0", ("Qwen2MoeForCausalLM",), True, False, None, True),      # listed MoE from 0.24
    ("0.24.0", ("Qwen2ForCausalLM",), False, False, None, False),
    ("0.25.0", ("Qwen2ForCausalLM",), False, False, None, True),        # every dense model from 0.25
    ("0.25.0", ("Qwen3MoeForCausalLM",), True, False, None, False),
    ("0.26.0", ("GraniteMoeHybridForCausalLM",), True, True, None, False),   # no hybrid in 0.25-0.26
    ("0.26.0", ("Qwen3ForCausalLM",), False, False, None, True),
    ("0.27.1", ("Qwen3ForCausalLM",), False, False, None, True),        # dense: V2
    ("0.27.1", ("Qwen3MoeForCausalLM",), True, False, None, False),     # MoE, not listed: V1
    ("0.27.1", ("Qwen2MoeForCausalLM",), True, False, None, True),      # MoE, listed
    ("0.28.0", ("Qwen3_5ForConditionalGeneration",), False, True, None, False),   # hybrid: V1
    ("0.28.0", ("DeepseekV4ForCausalLM",), True, False, None, True),    # listed from 0.28
    ("0.27.1", ("DeepseekV4ForCausalLM",), True, False, None, False),
    ("0.29.0", ("Qwen3_5MoeForConditionalGeneration",), True, True, None, True),   # every model from 0.29
    ("0.31.0", ("LlamaForCausalLM",), False, False, "0", False),       # VLLM_USE_V2_MODEL_RUNNER=0
    ("0.28.0", ("Qwen3MoeForCausalLM",), True, False, "1", True),
])
def test_the_v2_runner_is_the_default_the_release_chooses(version: str, architectures: tuple[str, ...], moe: bool,
                                                           hybrid: bool, env: str | None, v2: bool) -> None:
    """vLLM 0.22.0-0.28.0 vllm/config/vllm.py _is_default_v2_model_runner_model; 0.29.0 use_v2_model_runner."""
    assert runs_v2_runner(parse_version(version).parts, architectures, moe, hybrid, env) is v2


@pytest.mark.parametrize("version, architectures, quantized, v2", [
    ("0.22.0", ("Qwen3ForCausalLM",), True, False),    # 0.22 and 0.23 keep quantized checkpoints on V1
    ("0.23.0", ("LlamaForCausalLM",), True, False),
    ("0.24.0", ("LlamaForCausalLM",), True, True),
    ("0.28.0", ("Qwen2ForCausalLM",), True, True),
])
def test_the_v2_runner_takes_quantized_checkpoints_from_024(version: str, architectures: tuple[str, ...],
                                                             quantized: bool, v2: bool) -> None:
    """vLLM 0.22.0 / 0.23.0 vllm/config/vllm.py: `not model_config.is_moe and not model_config.is_quantized`."""
    assert runs_v2_runner(parse_version(version).parts, architectures, False, False, None, quantized) is v2


def test_the_v2_runner_takes_no_cuda_graph_memory_before_029() -> None:
    """The V2 runner's profile_cudagraph_memory returns 0 through 0.28 (0.28.0
    vllm/v1/worker/gpu/model_runner.py:843-845) and estimates from 0.29 (0.29.0 :896-898); the V1 runner's
    estimate is taken from 0.20 on. Qwen3 at 0.28 runs V2, Qwen3-MoE V1."""
    count = WeightCount(linear_params=7 * 10**9, embedding_params=2 * 151936 * 4096, vocab_size=151936,
                        hidden_size=4096, mlp_width_per_token=12288, num_layers=36)
    flags = settings("--max-num-seqs", "256", "--max-num-batched-tokens", "2048")

    def graphs(version: str, architectures: tuple[str, ...], moe: bool = False, **env: str) -> int:
        shape = replace(count, experts_per_token=8, moe_width=768) if moe else count
        return estimate_budget(flags, A100, shape, 15 * GiB, 2, 8192, parse_version(version), env=env,
                               architectures=architectures).cuda_graph_bytes

    assert graphs("0.28.0", ("Qwen3ForCausalLM",)) == 0
    assert graphs("0.28.0", ("Qwen3ForCausalLM",), VLLM_USE_V2_MODEL_RUNNER="0") == CUDA_GRAPH_BYTES
    assert graphs("0.28.0", ("Qwen3MoeForCausalLM",), moe=True) == CUDA_GRAPH_BYTES
    assert graphs("0.29.0", ("Qwen3ForCausalLM",)) == CUDA_GRAPH_BYTES
    assert graphs("0.22.0", ("LlamaForCausalLM",)) == CUDA_GRAPH_BYTES   # V1 at 0.22


def test_the_v2_samplers_penalty_state_is_charged_from_027() -> None:
    """From 0.27 the budget takes the free memory consumed since the worker's snapshot (vLLM 0.27.1,
    vllm/utils/mem_utils.py:317-326), so the V2 sampler's penalty statistics, allocated in load_model
    after the loader's figure (0.28.0 vllm/v1/worker/gpu/sample/penalties.py:32-42), count: max_num_seqs
    x vocabulary int32 and a bit mask of it. 0.26.0 measured the torch peak from the profile's start."""
    assert penalty_state_bytes(256, 151936) == 256 * (151936 + 4748) * 4
    count = WeightCount(linear_params=7 * 10**9, embedding_params=2 * 151936 * 4096, vocab_size=151936,
                        hidden_size=4096, mlp_width_per_token=12288, num_layers=36)
    flags = settings("--max-num-seqs", "256", "--max-num-batched-tokens", "2048")

    def non_kv(version: str, device: Device = A100, **env: str) -> int:
        return estimate_budget(flags, device, count, 15 * GiB, 2, 8192, parse_version(version), env=env,
                               architectures=("Qwen3ForCausalLM",)).non_kv_bytes

    state = penalty_state_bytes(256, 151936)
    assert non_kv("0.27.1") - non_kv("0.26.0") == state
    assert estimate_budget(flags, A100, count, 15 * GiB, 2, 8192, parse_version("0.28.0"),
                           architectures=("Qwen3ForCausalLM",)).parts()["runner_state"] == state
    # V1 instead: no penalty state, and the graph estimate the V2 runner of 0.28 does not make
    assert non_kv("0.28.0", VLLM_USE_V2_MODEL_RUNNER="0") == non_kv("0.28.0") - state + CUDA_GRAPH_BYTES
    moe = estimate_budget(flags, A100, replace(count, experts_per_token=8, moe_width=768), 15 * GiB, 2, 8192,
                          parse_version("0.28.0"), architectures=("Qwen3MoeForCausalLM",))
    assert moe.runner_state_bytes == 0
    cpu = Device("cpu", "cpu", None, 64 * GiB)
    assert estimate_budget(flags, cpu, count, 15 * GiB, 2, 8192, parse_version("0.28.0")).runner_state_bytes == 0


@pytest.mark.parametrize(("within", "runs", "low", "high"), [
    (27, 37, 0.570, 0.846),   # the source-held-out share at issue 38's stop 46: 73 % is 57-85 %
    (30, 37, 0.658, 0.905),   # the bar's 80 % on the same number of runs
    (10, 10, 0.722, 1.0),     # all within: the lower end is n / (n + z^2)
    (0, 10, 0.0, 0.278),
    (0, 0, 0.0, 1.0),         # no runs: nothing is known
])
def test_the_within_share_has_its_wilson_interval(within: int, runs: int, low: float, high: float) -> None:
    assert within_interval(within, runs) == pytest.approx((low, high), abs=0.001)


@pytest.mark.parametrize(("errors", "sources", "median", "within"), [
    ([("a", 0.01), ("a", -0.04), ("b", 0.02)], 2, 0.0225, 1.0),     # a's median |error| is 2.5 %: within
    ([("a", 0.10)] * 5 + [("b", 0.0), ("c", 0.01)], 3, 0.01, 2 / 3),  # five runs of one box weigh as one
    ([], 0, 0.0, 0.0),
])
def test_each_source_weighs_once_in_the_per_source_figure(errors: list[tuple[str, float]], sources: int,
                                                          median: float, within: float) -> None:
    summary = per_source_summary(errors)
    assert (summary.runs, summary.median, summary.within) == (sources, pytest.approx(median), pytest.approx(within))


@pytest.mark.parametrize("name", ["ixprof_gpt_oss_120b_h200_len9472_seqs4_v0220",
                                  "ixprof_gpt_oss_120b_h200_len2068_seqs4_v0220"])
def test_sliding_windows_hold_the_batches_in_flight_the_release_counts(name: str, tmp_path: Path) -> None:
    """gpt-oss at 0.22: a sliding-window layer holds its window and one batch per request (0.25.0
    kv_cache_interface.py:561), so the logged tokens (max concurrency x max_model_len) follow from the
    logged KV memory; from 0.26 every batch in flight counts (config/vllm.py:525), which at
    max_model_len 9472 and 8192 batched tokens under async scheduling leaves fewer tokens."""
    run = next(r for r in started_runs() if r["name"] == name)
    logged = run["logged"]["kv_cache_tokens"]
    at_022 = plan_run(run, tmp_path / "a", logged_kv=True).kv_cache_tokens
    assert abs(at_022 - logged) / logged < 0.001
    at_026 = plan_run({**run, "planned_for_vllm_version": "0.26.0"}, tmp_path / "b", logged_kv=True).kv_cache_tokens
    if "len9472" in name:   # max_model_len above the window plus one batch (127 + 8192)
        assert at_026 < 0.96 * at_022   # the window's demand doubles: 9472 tokens a request, not 8319
    else:
        assert at_026 == at_022          # max_model_len 2068 caps both rules


def test_vllm_mxfp4_use_marlin_pads_the_experts_as_marlin_does(tmp_path: Path) -> None:
    """gpt-oss-120b on an H200 at 0.22 with VLLM_MXFP4_USE_MARLIN=1 logs 'Using MARLIN Mxfp4 MoE backend'
    and 66.14 GiB of weights: planned with Marlin's tiles, within 0.5 GiB; without the variable the plan
    takes Hopper's Triton layout, 1.5 GiB less (vllm_releases/moe_kernels.py moe_backend_asked)."""
    run = next(r for r in started_runs() if r["name"] == "ixprof_gpt_oss_120b_h200_len2068_seqs4_v0220")
    asked = plan_run(run, tmp_path / "a").gpu_budget
    default = plan_run({**run, "flags": [f for f in run["flags"] if "VLLM_MXFP4_USE_MARLIN" not in f]},
                       tmp_path / "b").gpu_budget
    assert asked is not None and default is not None
    assert abs(asked.weights_bytes / GiB - run["logged"]["model_weights_gib"]) < 0.5
    assert asked.weights_bytes - default.weights_bytes > 1 * GiB


def test_a_lora_engine_is_planned_with_a_note_of_what_is_not_counted(tmp_path: Path) -> None:
    """--enable-lora allocates adapter slots in every LoRA-capable layer (vLLM 0.17.0
    lora/layers/base_linear.py:66-80; per expert on MoE layers, fused_moe.py:431-432) and profiles with
    dummy adapters (built in host memory, copied into the slots): Nemotron-3-Nano at rank 32 logs 1.76 GiB more weights and several GiB less KV than
    planned. The budget does not size them, and the plan says so; without the flag it says nothing."""
    run = next(r for r in started_runs() if r["name"] == "renta_nemotron3_nano_30b_rtxpro6000_lora_r32_u085_v0171")
    assert "--enable-lora" in plan_run(run, tmp_path / "a").kv_memory_source
    plain = {**run, "flags": [f for f in run["flags"] if "lora" not in f]}
    assert "lora" not in plan_run(plain, tmp_path / "b").kv_memory_source.lower()
