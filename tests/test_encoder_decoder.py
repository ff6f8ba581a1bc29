"""Encoder-decoder models (issue 39): Whisper's config.json loads, and its plan holds its cross-attention.

Whisper names its sizes per side (d_model, decoder_layers, decoder_attention_heads): kvwatch reads the
decoder's, the side whose layers hold vLLM's KV cache (planner/config_keys.py cites the release). Each
decoder layer holds a self-attention cache and a cross-attention cache (CrossAttentionSpec, reserved
per request for the encoder's tokens: planner/cross_attention.py; checked against vLLM's own sizing
in test_cross_attention.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.models.newest import NEWEST

from kvwatch.cli import main
from kvwatch.errors import ConfigError
from kvwatch.planner.cross_attention import CROSS
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for

WHISPER = NEWEST["whisper_large_v3"]["config"]


def test_whisper_config_loads_with_the_decoder_sizes() -> None:
    g = geometry_from_config(WHISPER)
    assert (g.layout.kinds.count("full"), g.layout.kinds.count(CROSS), g.num_attention_heads, g.num_kv_heads,
            g.head_size) == (
        WHISPER["decoder_layers"], WHISPER["decoder_layers"], WHISPER["decoder_attention_heads"],
        WHISPER["decoder_attention_heads"],
        WHISPER["d_model"] // WHISPER["decoder_attention_heads"])
    assert g.default_max_model_len == WHISPER["max_target_positions"]


def test_whisper_is_planned_with_a_group_of_each_kind_and_nothing_refused() -> None:
    settings = EngineCommand.parse(["vllm", "serve", "openai/whisper-large-v3", "--max-model-len", "448",
                                    "--kv-cache-dtype", "fp8"]).settings()
    plan = make_plan(geometry_from_config(WHISPER), settings, preset("rtx-pro-6000"), ruleset_for(None), MemoryInputs())
    assert plan.source == "estimated" and plan.unknown_layer_types == () and plan.kv_cache_groups == 2
    assert not plan.will_fail and plan.fixes(certain_only=False).empty


def test_kvwatch_plan_of_whisper_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "whisper").mkdir()
    (tmp_path / "whisper" / "config.json").write_text(json.dumps(WHISPER))
    assert main(["plan", "--preset", "h100", "--", "vllm", "serve", str(tmp_path / "whisper")]) == 0
    out = capsys.readouterr().out
    assert "UNKNOWN" not in out and "OK: vLLM should accept this plan" in out


def test_a_whisper_config_without_its_decoder_heads_is_one_clear_error() -> None:
    broken = {k: v for k, v in WHISPER.items() if k != "decoder_attention_heads"}
    with pytest.raises(ConfigError, match="missing field .decoder_attention_heads. \\(its .num_attention_heads.\\)"):
        geometry_from_config(broken)
