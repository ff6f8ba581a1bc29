"""Every wording of every vLLM release kvwatch read (kvwatch/vllm_releases/texts.py, generated from each
release's source by scripts/gen_vllm_texts.py): rendered with sample values the way the release raises
it, each must be named by the diagnosis as the class the table records."""
from __future__ import annotations

import re

import pytest

from kvwatch.diagnosis import diagnose
from kvwatch.vllm_releases.texts import LORA_RANKS, TEXTS, ReleaseText

_PLACEHOLDER = re.compile(r"\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
# Sample values by what a placeholder's expression names (anything else is a number).
_SAMPLES = (
    ("estimated", ""), ("_msg", ""), ("hint", ""), ("suggest", ""),
    ("arch", "['FooForCausalLM']"), ("specs", "[{'GPU': 1.0}]"), ("reasons", "{FLASH_ATTN: [block_size not supported]}"),
    ("invalid", "{FLASH_ATTN: [block_size not supported]}"), ("join", "hermes, mistral"), ("parser", "nosuch"),
    ("backends", "FLASH_ATTN"), ("backend", "FLASH_ATTN"), ("device", "cuda:0"), ("config", "head_size=64, dtype=torch.bfloat16"),
    ("dtype", "bfloat16"), ("name", "FLASH_ATTN"), ("key", "max_position_embeddings"), ("sizes", "[16, 32]"),
)


def _sample(expr: str) -> str:
    name, _, spec = expr.partition(":")
    name = re.split(r"[^\w]+", name.strip(")] "))[-1] or name   # the last name of an attribute chain
    for word, value in _SAMPLES:
        if word in name:
            return value
    if spec.endswith("f"):
        return format(16.0, spec)
    return "16"


def render(template: str) -> str:
    return _PLACEHOLDER.sub(lambda m: _sample(m[1]), template)


def _log(release: str, text: ReleaseText) -> list[str]:
    # Configuration and the front end are checked in the API server before any engine core starts: a
    # plain traceback there; the rest is raised in an engine core and logged at ERROR.
    front = any(part in text.file for part in ("entrypoints", "/config", "arg_utils", "models/registry"))
    where = "(APIServer pid=1)" if front else "(EngineCore_DP0 pid=2) ERROR 01-01 00:00:00 [core.py:1]"
    exception = "vllm.v1.engine.exceptions.EngineDeadError" if text.kind == "engine_died" else "ValueError"
    return [f"{where} Traceback (most recent call last):",
            f'{where}   File "/usr/lib/python3/site-packages/{text.file}", line {text.line}, in f',
            f"{where}     raise {exception}(",
            f"{where} {exception}: {render(text.template)}"]


CASES = [(release, t) for release, texts in TEXTS.items() for t in texts]


def test_every_release_has_its_texts() -> None:
    assert len(TEXTS) >= 26
    for release, texts in TEXTS.items():
        assert {"kv_cache_too_small", "no_cache_blocks", "lora_rank_above_max"} <= {t.text_id for t in texts}, release


@pytest.mark.parametrize("release,text", CASES, ids=[f"{r}-{t.text_id}-{t.line}" for r, t in CASES])
def test_release_text_is_classified(release: str, text: ReleaseText) -> None:
    d = diagnose(_log(release, text))
    assert d.kind.value == text.kind, (release, text.file, text.line, render(text.template), d)
    assert d.evidence


def test_lora_ranks_per_release() -> None:
    assert set(LORA_RANKS) == set(TEXTS)
    for ranks, file, line in LORA_RANKS.values():
        assert 16 in ranks and list(ranks) == sorted(ranks) and file.startswith("vllm/") and line > 0
