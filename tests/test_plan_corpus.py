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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fixtures.models import corpus

from kvwatch.boundary.device_probe import cpu_device
from kvwatch.boundary.plan_loader import plan_command
from kvwatch.planner.devices import Device, cpu_device_from_flags
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import ruleset_for

TRUTH_FILE = Path(__file__).parent / "fixtures" / "models" / "kv_truth.json"
TRUTH = json.loads(TRUTH_FILE.read_text())
SIZED = [c for c in TRUTH["cases"] if c.get("kv_cache_tokens") is not None]
CASE_IDS = [f"{c['model']}{'-' + '-'.join(f.lstrip('-') for f in c['flags']) if c['flags'] else ''}" for c in SIZED]


# The CPU the figures were recorded on: vLLM's choices depend on its ISA (an SSM state is float32
# where the CPU has AVX-512 BF16), so the recorded figures are planned for that CPU, the live ones
# for this machine's.
RECORDED_CPU = cpu_device_from_flags(set(TRUTH["cpu_flags"]), "the recording machine's CPU")


def plan_case(name: str, flags: list[str], directory: Path, device: Device | None = None) -> Plan:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(corpus.CORPUS[name]["config"]))
    extra = list(flags) if "--max-model-len" in flags else ["--max-model-len", "2048", *flags]
    return plan_command(["vllm", "serve", str(directory), *extra], device or RECORDED_CPU, ruleset_for(None),
                        env={"VLLM_CPU_KVCACHE_SPACE": str(TRUTH["kv_space_gib"])})


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
    plan = plan_case(case["model"], case["flags"], tmp_path / "model")
    assert plan_figures(plan) == engine_figures(case)


# -- live: the same cases on the real engine ---------------------------------------------------

@pytest.fixture(scope="module")
def live_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Probe every recorded case on the real engine, two at a time (each ~30-60 s alone)."""
    from engine_support import require_engine
    from kv_probe import probe
    require_engine()
    root = tmp_path_factory.mktemp("corpus")

    def run(index: int) -> tuple[str, dict]:
        case = SIZED[index]
        return CASE_IDS[index], probe(corpus.CORPUS[case["model"]]["config"], case["flags"], root / str(index))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, range(len(SIZED))))


@pytest.mark.engine
@pytest.mark.parametrize("index", range(len(SIZED)), ids=CASE_IDS)
def test_plan_equals_the_live_engine(index: int, live_cases: dict[str, dict], tmp_path: Path) -> None:
    case = SIZED[index]
    live = live_cases[CASE_IDS[index]]
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
