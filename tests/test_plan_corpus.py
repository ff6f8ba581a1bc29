"""The planner on the architecture corpus: blocks, block size, KV tokens and concurrency exactly as
the real vLLM CPU engine decides them.

Two layers of the same check:
- every case recorded from the real engine (tests/fixtures/models/kv_truth.json, written by
  tests/record_kv_truth.py) against the planner: fast, no engine;
- the engine marker: the same cases probed live (tests/kv_probe.py), so a vLLM that decides
  differently fails CI even when nobody re-recorded the file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures.models import corpus
from fixtures.models.corpus_beyond import BEYOND

from kvwatch.boundary.device_probe import cpu_device
from kvwatch.boundary.plan_loader import plan_command
from kvwatch.cli import main
from kvwatch.exitcodes import EXIT_PLAN_WILL_FAIL
from kvwatch.planner.architectures import (
    KDA_NEEDS_CUTLASS,
    MAMBA_BLOCK_SIZE_WITHOUT_PREFIX_CACHING,
    QWEN2_SOME_LAYERS_SLIDE,
    SPARSE_ATTENTION_ON_CPU,
    TRANSFORMERS_BACKEND_NO_ATTENTION,
)
from kvwatch.planner.devices import Device, cpu_device_from_flags
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

TRUTH_FILE = Path(__file__).parent / "fixtures" / "models" / "kv_truth.json"
TRUTH = json.loads(TRUTH_FILE.read_text())
SIZED = [c for c in TRUTH["cases"] if c.get("kv_cache_tokens") is not None and c.get("num_blocks") is not None]
# Sized, then dead before reporting its blocks: the plan must equal the sizing and predict the failure.
SIZED_THEN_FAILED = [c for c in TRUTH["cases"] if c.get("kv_cache_tokens") is not None and c.get("num_blocks") is None]
CASE_IDS = [f"{c['model']}{'-' + '-'.join(f.lstrip('-') for f in c['flags']) if c['flags'] else ''}" for c in SIZED]


# The CPU the figures were recorded on: vLLM's choices depend on its ISA (an SSM state is float32
# where the CPU has AVX-512 BF16), so the recorded figures are planned for that CPU, the live ones
# for this machine's.
RECORDED_CPU = cpu_device_from_flags(set(TRUTH["cpu_flags"]), "the recording machine's CPU")


def plan_case(name: str, flags: list[str], directory: Path, device: Device | None = None,
              vllm_version: str | None = None) -> Plan:
    """The plan for a corpus case as the recorder ran it; `vllm_version` plans it as that release
    (`kvwatch plan --vllm-version`), None as the installed one."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(corpus.CORPUS[name]["config"]))
    extra = list(flags) if "--max-model-len" in flags else ["--max-model-len", "2048", *flags]
    return plan_command(["vllm", "serve", str(directory), *extra], device or RECORDED_CPU, ruleset_for(vllm_version),
                        env={"VLLM_CPU_KVCACHE_SPACE": str(TRUTH["kv_space_gib"])},
                        vllm_version=parse_version(vllm_version) if vllm_version else None)


def engine_figures(case: dict) -> tuple:
    return (case["num_blocks"], case["block_size"], case["kv_cache_tokens"], case["max_concurrency"],
            case["max_model_len"])


def plan_figures(plan: Plan) -> tuple:
    # vLLM logs the concurrency with two decimals
    return (plan.num_blocks, plan.block_size, plan.kv_cache_tokens, round(plan.max_concurrency or 0, 2),
            plan.max_model_len)


def test_the_corpus_covers_the_architectures_people_serve(tmp_path: Path) -> None:
    names = {c["model"] for c in SIZED}
    assert len(names) >= 12
    kinds = {k for name in names for k in plan_case(name, [], tmp_path / name).padding_bytes}
    assert {"layer_padding", "state_padding"} <= kinds
    for entry in corpus.CORPUS.values():
        assert entry["source"], "every corpus config names the public config.json it shrinks"


@pytest.mark.parametrize("case", SIZED, ids=CASE_IDS)
def test_plan_equals_the_recorded_engine(case: dict, tmp_path: Path) -> None:
    # planned as the release that recorded the figures, whatever this machine has installed
    plan = plan_case(case["model"], case["flags"], tmp_path / "model", vllm_version=TRUTH["vllm"])
    assert plan_figures(plan) == engine_figures(case)


# -- live: the same cases on the real engine ---------------------------------------------------
# CI stays cheap (issue 43): every case is checked against its recorded figures above
# (tests/record_kv_truth.py re-records them from the engine); live, one case per cache kind, and the
# cases whose figures depend on this machine's CPU (an SSM state is float32 or bfloat16 by its ISA;
# fp8 KV needs AVX-512): plain attention, sliding beside full, MLA, a gated delta net hybrid with a
# hybrid block size of the user's, a Mamba-2 hybrid, a pure state-space model, a short convolution,
# KV sharing with wide layers, and fp8 KV. KVWATCH_LIVE_CORPUS=all probes every recorded case.
LIVE_KINDS = {("llama3", ()), ("gemma3_text", ()), ("deepseek_v3", ()), ("qwen3_next", ("--block-size", "1280")),
              ("granite4_h", ()), ("mamba_codestral", ()), ("lfm2", ()), ("gemma4_e2b", ()),
              ("llama3", ("--kv-cache-dtype", "fp8"))}


def _live(case: dict) -> bool:
    return os.environ.get("KVWATCH_LIVE_CORPUS") == "all" or (case["model"], tuple(case["flags"])) in LIVE_KINDS


LIVE = [i for i, c in enumerate(SIZED) if _live(c)]


@pytest.mark.engine
@pytest.mark.parametrize("index", LIVE, ids=[CASE_IDS[i] for i in LIVE])
def test_plan_equals_the_live_engine(index: int, tmp_path: Path) -> None:
    """Each case probes its own engine (~30-60 s alone): scripts/test runs two tests at a time."""
    from engine_support import require_engine
    from kv_probe import probe
    require_engine()
    case = SIZED[index]
    live = probe(corpus.CORPUS[case["model"]]["config"], case["flags"], tmp_path / "probe")
    device = cpu_device()
    plan = plan_case(case["model"], case["flags"], tmp_path / "model", device=device)
    if "fp8" in case["flags"] and not device.cpu_fp8_kv:
        # A CPU without AVX-512/AMX: vLLM sizes the cache, logs its size, then refuses the fp8
        # kernels; the plan must predict both the refusal and the size.
        assert [w.kind for w in plan.warnings] == ["kv_dtype_unsupported"]
        assert live["num_blocks"] is None and live["kv_cache_tokens"] == plan.kv_cache_tokens
        return
    assert live["kv_cache_tokens"] is not None, live["error"]
    assert plan_figures(plan) == engine_figures(live)


@pytest.mark.parametrize("flags", [[], ["--block-size", "64"]])
def test_a_multimodal_config_is_planned_from_its_text_config(flags: list[str], tmp_path: Path) -> None:
    """vLLM on this CPU cannot inspect Gemma3ForConditionalGeneration without torchvision (recorded:
    the gemma3_mm cases failed before sizing), so the engine checks its language model as a text-only
    checkpoint (gemma3_mm_text) and the multimodal config must plan exactly like it."""
    multimodal = plan_case("gemma3_mm", flags, tmp_path / "mm")
    text_only = plan_case("gemma3_mm_text", flags, tmp_path / "text")
    assert plan_figures(multimodal) == plan_figures(text_only)
    recorded = next(c for c in SIZED if c["model"] == "gemma3_mm_text" and c["flags"] == flags)
    assert plan_figures(multimodal) == engine_figures(recorded)
    assert any(c["model"] == "gemma3_mm" and "torchvision" in str(c.get("errors") or c.get("error"))
               for c in TRUTH["cases"])


# -- issue 26: refusals, unknown layers, the defaults config.json leaves out ----------------------

# The corpus entries the real engine refuses, and the sentence it refuses them with (recorded in
# kv_truth.json): the plan must predict each refusal with vLLM's own sentence and exit 3.
REFUSED = {
    "qwen2_swa_some_layers": QWEN2_SOME_LAYERS_SLIDE,
    "deepseek_v32": SPARSE_ATTENTION_ON_CPU,
    # left vLLM's own models in 0.23; transformers has it, so vLLM tries its Transformers backend
    "bamba": TRANSFORMERS_BACKEND_NO_ATTENTION,
    "kimi_linear": MAMBA_BLOCK_SIZE_WITHOUT_PREFIX_CACHING,
    "glm5": SPARSE_ATTENTION_ON_CPU,
}
# Refused with these flags (model, flags) -> the sentence.
REFUSED_WITH_FLAGS = {
    # Falcon-Mamba's config.json names no length: vLLM keeps the -1 of auto and refuses it
    ("falcon_mamba", ("--max-model-len", "auto")): "max_model_len must be a positive integer, got int: -1",
    # Kimi-Linear without prefix caching: past the first refusal, KDA is NVIDIA's implementation only
    ("kimi_linear", ("--no-enable-prefix-caching",)): KDA_NEEDS_CUTLASS,
}


def recorded_case(name: str, flags: list[str] | None = None) -> dict:
    return next(c for c in TRUTH["cases"] if c["model"] == name and c["flags"] == (flags or []))


@pytest.mark.parametrize("name", REFUSED)
def test_a_refused_architecture_is_predicted_with_vllms_sentence(name: str, tmp_path: Path, capsys) -> None:
    recorded = recorded_case(name)
    assert recorded["kv_cache_tokens"] is None
    assert any(REFUSED[name] in sentence for sentence in recorded["errors"]), recorded["errors"]
    plan = plan_case(name, [], tmp_path / "model")
    assert plan.will_fail
    assert any(REFUSED[name] in w.message for w in plan.warnings if w.certain)
    rc = main(["plan", "--device", "cpu", "--", "vllm", "serve", str(tmp_path / "model"), "--max-model-len", "2048"])
    assert rc == EXIT_PLAN_WILL_FAIL
    assert REFUSED[name] in capsys.readouterr().out


@pytest.mark.parametrize("key", REFUSED_WITH_FLAGS, ids=lambda k: f"{k[0]}-{'-'.join(k[1])}")
def test_a_refused_flag_combination_is_predicted_with_vllms_sentence(key: tuple, tmp_path: Path) -> None:
    name, flags = key
    recorded = recorded_case(name, list(flags))
    assert recorded["kv_cache_tokens"] is None
    assert any(REFUSED_WITH_FLAGS[key] in sentence for sentence in recorded["errors"]), recorded["errors"]
    plan = plan_case(name, list(flags), tmp_path / "model")
    assert plan.will_fail and any(REFUSED_WITH_FLAGS[key] in w.message for w in plan.warnings if w.certain)


def test_every_new_architecture_is_sized_or_refused_as_the_engine_did() -> None:
    """No issue-26 entry is left unexplained: the engine sized it (and the planner equals it, above)
    or refused it with a sentence the planner predicts."""
    for case in (c for c in TRUTH["cases"] if c["model"] in BEYOND):
        explained = (case["kv_cache_tokens"] is not None or (case["model"] in REFUSED and not case["flags"])
                     or (case["model"], tuple(case["flags"])) in REFUSED_WITH_FLAGS)
        assert explained, (case["model"], case["flags"], case.get("error"))
    assert all(any(c["model"] == name for c in TRUTH["cases"]) for name in BEYOND)
    sized = {c["model"] for c in SIZED if c["model"] in BEYOND}
    assert len(sized) >= 15


def test_an_unknown_layer_type_is_planned_and_said_not_refused(tmp_path: Path, capsys) -> None:
    """A layer type kvwatch has no rule for: exit 0 (vLLM may well serve it), the plan's source is
    "unknown" and the text names the type."""
    config = corpus.config("olmo3")
    config["layer_types"] = ["sliding_attention", "sliding_attention", "lightning_attention", "full_attention"] * 2
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    rc = main(["plan", "--device", "cpu", "--", "vllm", "serve", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "UNKNOWN: kvwatch cannot classify: lightning_attention" in out
    plan = plan_command(["vllm", "serve", str(tmp_path / "m")], RECORDED_CPU, ruleset_for(None),
                        env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert plan.source == "unknown" and plan.unknown_layer_types == ("lightning_attention",)


def test_a_head_dim_left_out_takes_the_config_class_default(tmp_path: Path) -> None:
    """Qwen3 without head_dim: transformers' Qwen3Config fills 128, not hidden/heads = 64; the
    recorded engine's blocks prove which one vLLM used."""
    config = corpus.config("qwen3_no_head_dim")
    assert "head_dim" not in config and config["hidden_size"] // config["num_attention_heads"] == 64
    plan = plan_case("qwen3_no_head_dim", [], tmp_path / "m")
    assert plan.kv_bytes_per_token_per_layer == 4 * 2 * 128 * 2
    assert plan_figures(plan) == engine_figures(recorded_case("qwen3_no_head_dim"))


@pytest.mark.parametrize("case", SIZED_THEN_FAILED, ids=[f"{c['model']}-{'-'.join(c['flags'])}" for c in SIZED_THEN_FAILED])
def test_a_case_the_engine_sizes_then_fails_is_sized_and_predicted(case: dict, tmp_path: Path) -> None:
    """Gemma 4 with --disable-hybrid-kv-cache-manager: vLLM logs its KV cache size, then fails on a
    KV-shared layer (KeyError on its name). The plan's tokens and concurrency equal the logged ones,
    and the plan says it fails with vLLM's sentence."""
    plan = plan_case(case["model"], case["flags"], tmp_path / "model")
    assert (plan.kv_cache_tokens, round(plan.max_concurrency or 0, 2), plan.max_model_len) == \
        (case["kv_cache_tokens"], case["max_concurrency"], case["max_model_len"])
    assert plan.will_fail
    predicted = [w.message.split(": vLLM")[0] for w in plan.warnings if w.certain]
    assert any(p in sentence for p in predicted for sentence in case.get("errors") or []), (predicted, case.get("errors"))
