"""EXAONE's sliding_window_pattern (issue 39): the config.json variants vLLM cannot load, predicted.

vLLM loads config.json through transformers' config class (planner/layer_pattern.py); EXAONE 4's and
EXAONE-MoE's list `layer_types` from `sliding_window_pattern` with a modulo when config.json has none.
The oracle is vLLM's own get_config, run on each variant in a subprocess by
scripts/oracle_layer_pattern.py (no engine); its answers are recorded in
tests/fixtures/layer_pattern_oracle.json, so kvwatch is checked against them without vLLM. Where the
recorded vLLM and transformers import here, the oracle runs again and must give the recorded answers.
The tracebacks `vllm serve` would end with (vLLM's own EngineArgs.create_model_config on the variants
that raise) are recorded too (tests/fixtures/layer_pattern_tracebacks.json), and kvwatch diagnose must
name them config_refused with the config class's sentence.
Record them anew with `python tests/test_layer_pattern.py` under that vLLM.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.corpus_beyond import BEYOND

from kvwatch.cli import main
from kvwatch.diagnosis.diagnose import LogScanner
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.layer_pattern import pattern_error
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.predicted_refusal import CONFIG_REFUSED
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "layer_pattern_oracle.json"
TRACEBACKS = ROOT / "tests" / "fixtures" / "layer_pattern_tracebacks.json"
ORACLE = ROOT / "scripts" / "oracle_layer_pattern.py"
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
_EXAONE4 = BEYOND["exaone4"]["config"]   # EXAONE-4.0-32B's layout: layer_types listed, pattern "LLLG"
_UNLISTED = {k: v for k, v in _EXAONE4.items() if k != "layer_types"}
_MOE = {**_UNLISTED, "model_type": "exaone_moe", "architectures": ["ExaoneMoEForCausalLM"]}
ABSENT = object()   # the key left out of config.json


def _variant(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is ABSENT:
            out.pop(key, None)
        else:
            out[key] = value
    return out


CASES: dict[str, dict[str, Any]] = {
    "listed, string pattern": _variant(_EXAONE4),
    "string pattern": _variant(_UNLISTED, sliding_window_pattern="LLLG"),
    "int pattern 4": _variant(_UNLISTED, sliding_window_pattern=4),
    "int pattern 2": _variant(_UNLISTED, sliding_window_pattern=2),
    "null pattern": _variant(_UNLISTED, sliding_window_pattern=None),
    "no pattern": _variant(_UNLISTED, sliding_window_pattern=ABSENT),
    "int pattern 0": _variant(_UNLISTED, sliding_window_pattern=0),
    "null window, string pattern": _variant(_UNLISTED, sliding_window=None),
    "null window, listed": _variant(_EXAONE4, sliding_window=None, layer_types=["full_attention"] * 8),
    "no window, int pattern": _variant(_UNLISTED, sliding_window=ABSENT, sliding_window_pattern=4),
    "moe, string pattern": _variant(_MOE, sliding_window_pattern="LLLG"),
    "moe, int pattern": _variant(_MOE, sliding_window_pattern=4),
}
_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}
RAISING = ("string pattern", "null pattern", "null window, string pattern", "moe, string pattern")


def _recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())  # type: ignore[no-any-return]


def _run_oracle() -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(ORACLE)], input=json.dumps(list(CASES.values())),
                         capture_output=True, text=True, timeout=600, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return {**answer, "answers": dict(zip(CASES, answer["answers"], strict=True))}


def _tracebacks() -> dict[str, str]:
    """Each raising case's traceback, all in one run of the oracle (one import of vLLM)."""
    run = subprocess.run([sys.executable, str(ORACLE), "--tracebacks"], input=json.dumps([CASES[n] for n in RAISING]),
                         capture_output=True, text=True, timeout=600, check=True)
    return dict(zip(RAISING, json.loads(run.stdout.strip().splitlines()[-1]), strict=True))


def _installed_oracle() -> dict[str, Any] | None:
    """The oracle's answers where the installed vLLM and transformers import, else None."""
    try:
        return _run_oracle()
    except (subprocess.CalledProcessError, ValueError, IndexError):
        return None


def _cpu_plan(config: dict[str, Any], release: str) -> Any:
    settings = EngineCommand.parse(["vllm", "serve", "LGAI-EXAONE/EXAONE-4.0-32B"]).settings()
    memory = MemoryInputs(vllm_version=parse_version(release), cpu_kv_space_bytes=4 << 30)
    return make_plan(geometry_from_config(config, release), settings, Device("cpu", "cpu"), ruleset_for(release),
                     memory)


def test_every_recorded_answer_names_its_case() -> None:
    assert set(_recorded()["answers"]) == set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_kvwatch_predicts_what_vllm_loads(name: str) -> None:
    """Where vLLM's get_config raises, kvwatch names the same exception line; where it loads, kvwatch plans the
    layer types and window the loaded config has."""
    config, answer = CASES[name], _recorded()["answers"][name]
    error = pattern_error(config, config["model_type"])
    if "error" in answer:
        assert error is not None and error.sentence == answer["error"]
        return
    assert error is None
    geometry = geometry_from_config(config)
    assert list(geometry.layer_kinds) == [_KINDS[t] for t in answer["layer_types"]]
    if "sliding" in geometry.layer_kinds:
        assert geometry.sliding_window == answer["sliding_window"]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", CASES)
def test_the_plan_refuses_what_vllm_cannot_load(name: str, release: str) -> None:
    """Every known release loads config.json through the same call (layer_pattern.py): the plan fails
    with vLLM's exception line exactly where the recorded oracle raised, on the CPU as on a GPU."""
    answer = _recorded()["answers"][name]
    plan = _cpu_plan(CASES[name], release)
    refused = [w for w in plan.warnings if w.kind == CONFIG_REFUSED and "sliding_window_pattern" in w.message]
    if "error" in answer:
        assert plan.will_fail and len(refused) == 1 and refused[0].message.startswith(answer["error"] + ": ")
        assert "configuration_exaone" in refused[0].message and "transformers_utils/config.py" in refused[0].message
    else:
        assert refused == []


def test_kvwatch_plan_exits_3_with_the_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CASES["string pattern"]))
    code = main(["plan", "--device", "cpu", "--vllm-version", "0.32.0", "--", "vllm", "serve", str(tmp_path)])
    assert code == 3
    assert "TypeError: unsupported operand type(s) for %: 'int' and 'str'" in capsys.readouterr().out


def test_the_oracle_gives_the_recorded_answers() -> None:
    """vLLM's own get_config, run again where the recorded vLLM and transformers import."""
    oracle, recorded = _installed_oracle(), _recorded()
    if oracle is None or (oracle["vllm"], oracle["transformers"]) != (recorded["vllm"], recorded["transformers"]):
        pytest.skip("the recorded vLLM and transformers do not import here")
    assert oracle == recorded
    assert _tracebacks() == json.loads(TRACEBACKS.read_text())


@pytest.mark.parametrize("name", RAISING)
def test_diagnose_names_the_config_class_refusal(name: str) -> None:
    text = json.loads(TRACEBACKS.read_text())[name]
    sentence = _recorded()["answers"][name]["error"].split(": ", 1)[1]
    diagnosis = LogScanner().feed_all(text.splitlines()).result()
    assert diagnosis.kind is FailureKind.CONFIG_REFUSED and diagnosis.fatal
    assert diagnosis.evidence == sentence and diagnosis.facts["refusal"] == "layer_types_from_pattern"


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(_run_oracle(), indent=1) + "\n")
    TRACEBACKS.write_text(json.dumps(_tracebacks(), indent=1) + "\n")
    print(f"recorded {FIXTURE} and {TRACEBACKS}")
