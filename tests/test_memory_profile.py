"""The engine's own memory profile, read from real GPU start-up logs (tests/fixtures/gpu_logs)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.diagnosis.memory_profile import GiB, parse_profile

LOGS = Path(__file__).parent / "fixtures" / "gpu_logs"
RUNS = [r for r in json.loads((LOGS / "corpus.json").read_text()) if r.get("log_file")]


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_the_profile_read_equals_the_figures_the_log_shows(run: dict) -> None:
    lines = (LOGS / run["log_file"]).read_text().splitlines()
    profile = parse_profile(lines)
    logged = run["logged"]
    for part, key, rounding in (("kv_cache", "available_kv_cache_gib", 0.005),
                                ("weights", "model_weights_gib", 0.005),
                                ("cuda_graphs", "cudagraph_gib", 0.005),
                                ("activation_peak", "activation_peak_gib", 0.005),
                                ("non_torch", "non_torch_gib", 0.005)):
        expected = logged.get(key)
        got = profile.parts().get(part)
        if expected is None or got is None:
            continue
        if expected < 0:     # a failed start: vLLM printed a negative rest of memory
            assert got == 0
            continue
        assert abs(got / GiB - expected) <= rounding, (part, got / GiB, expected)
    assert profile.parts(), "every log of the corpus names at least one part"
