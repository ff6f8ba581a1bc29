"""The drafts kvwatch gives a verdict of their own (kvwatch/planner/draft_heads.py): ParseAuxMTPModel
builds no cache layer at all, and eight drafts whose layers kvwatch plans with their target (the verdict
DRAFT), ExtractHiddenStatesModel's hidden-state cache among them.

The generated architecture table (read from each release's source) must agree with what the module
says each builds; where the releases are unpacked (KVWATCH_VLLM_SRC), the cited source is read again:
the draft head's module defines no attention layer, and the hidden-state layer's spec is an MLA spec
that only a speculative config builds."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from vllm_sources import release_tree

from kvwatch.planner.architecture_kinds import DRAFT, PLANNED_KINDS, UNKNOWN, unknown_reasons, verdict
from kvwatch.planner.draft_heads import DRAFTS, draft_reason, planned_with_target
from kvwatch.vllm_releases.architectures import ARCHITECTURES

RELEASES = ("0.33.0", "0.34.0")
# (architecture, the cache layer kinds the release's table lists for it)
CASES = [("ParseAuxMTPModel", ()), ("ExtractHiddenStatesModel", ("CacheOnlyAttentionLayer",))]
UNPLANNED = [case for case in CASES if not planned_with_target(case[0])]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("architecture", "kinds"), CASES)
def test_the_table_agrees_with_what_the_draft_builds(release: str, architecture: str, kinds: tuple[str, ...]) -> None:
    found = ARCHITECTURES[release][architecture]
    assert found.group == "speculative_decoding"
    assert found.kinds == kinds
    assert DRAFTS[architecture].builds_cache == bool(kinds)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("architecture", "kinds"), UNPLANNED)
def test_the_verdict_gives_the_drafts_own_reason(release: str, architecture: str, kinds: tuple[str, ...]) -> None:
    v = verdict(architecture, release)
    reason = draft_reason(architecture)
    assert v.handling == UNKNOWN and reason is not None and v.reason.endswith(reason)
    assert v.unclassified == (kinds or (ARCHITECTURES[release][architecture].cls,))
    assert ("no cache layer at all" in v.reason) == (not kinds)


# The draft heads planned with their target, and where vLLM's code shows it never serves one alone: the
# line (0.33.0, 0.34.0; None: the release does not register it) that asserts a speculative config, or the
# forward that takes the target's hidden states.
ASSERTS = "assert vllm_config.speculative_config is not None"
PLANNED_DRAFTS: dict[str, tuple[str, tuple[int | None, int], str]] = {
    "Step5MTP": ("models/step5/nvidia/mtp.py", (120, 124), "previous_hidden_states: torch.Tensor"),
    "Dots3NoteMTPModel": ("models/dots3_note/nvidia/mtp.py", (37, 37), ASSERTS),
    "Glm5NextMTPModel": ("models/glm5next/common/mtp.py", (48, 51), ASSERTS),
    "Qwen4ExpMTP": ("models/qwen4_exp/nvidia/mtp.py", (133, 133), "raise ValueError(\"speculative_config.draft_model_config"),
    "DSparkDraftModel": ("models/deepseek_v4/nvidia/dspark.py", (92, 92), ASSERTS),
    "DSparkV41DraftModel": ("models/deepseek_v41/nvidia/dspark.py", (71, 76), ASSERTS),
    "MistralLarge4DSparkModel": ("models/mistral/mistral_large4/nvidia/dspark.py", (None, 88), ASSERTS),
    "ExtractHiddenStatesModel": ("model_executor/models/extract_hidden_states.py", (325, 325),
                                 "assert speculative_config is not None"),
}
# (release, draft) where the release registers the draft
REGISTERED = [(r, a) for a, (_, lines, _) in PLANNED_DRAFTS.items() for r, line in zip(RELEASES, lines, strict=True) if line]
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("release", "architecture"), REGISTERED)
def test_a_draft_planned_with_its_target_is_a_draft_head_of_planned_kinds(release: str, architecture: str) -> None:
    found, v = ARCHITECTURES[release][architecture], verdict(architecture, release)
    assert found.group == "speculative_decoding" and found.kinds and all(k in PLANNED_KINDS for k in found.kinds)
    assert v.handling == DRAFT and v.reason.endswith(f"planned with its target ({planned_with_target(architecture)}): "
                                                     f"plan the target's config.json with that method")
    assert (ROOT / "kvwatch" / planned_with_target(architecture)).is_file()


@pytest.mark.parametrize("architecture", PLANNED_DRAFTS)
def test_a_config_of_the_draft_alone_is_planned_unknown(architecture: str) -> None:
    reasons = unknown_reasons((architecture,), {}, False, "0.34.0")
    assert len(reasons) == 1 and "a draft head, planned with its target" in reasons[0]


@pytest.mark.parametrize(("release", "architecture"), REGISTERED)
def test_vllm_builds_the_draft_only_beside_its_target(release: str, architecture: str) -> None:
    path, lines, text = PLANNED_DRAFTS[architecture]
    line = lines[RELEASES.index(release)]
    assert line is not None and text in _source(release, path).splitlines()[line - 1]


def test_a_draft_a_release_does_not_register_is_named_so() -> None:
    assert [(r, a) for a in PLANNED_DRAFTS for r in RELEASES if (r, a) not in REGISTERED] == \
        [("0.33.0", "MistralLarge4DSparkModel")]
    assert "MistralLarge4DSparkModel" not in ARCHITECTURES["0.33.0"]


def test_other_architectures_have_no_draft_reason() -> None:
    assert draft_reason("EagleLlamaForCausalLM") is None
    assert verdict("EagleLlamaForCausalLM", "0.34.0").handling != UNKNOWN


def _source(release: str, path: str) -> str:
    tree = release_tree(release, f"vllm/{path}")
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    return (tree / "vllm" / path).read_text(encoding="utf-8")


@pytest.mark.parametrize("release", RELEASES)
def test_the_draft_head_builds_no_attention_layer(release: str) -> None:
    module = ast.parse(_source(release, "model_executor/models/nemotron_parse3_5_mtp.py"))
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(module) if isinstance(n, ast.Name | ast.Attribute)}
    names |= {n.name for n in ast.walk(module) if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    assert {"ParseAuxMTPModel", "Linear", "Embedding"} <= names
    assert not {n for n in names if "Attention" in n or n == "get_kv_cache_spec"}


@pytest.mark.parametrize("release", RELEASES)
def test_the_hidden_state_cache_is_an_mla_spec_built_for_a_draft_only(release: str) -> None:
    lines = _source(release, "model_executor/models/extract_hidden_states.py").splitlines()
    assert "assert speculative_config is not None" in lines[325 - 1]
    assert "return HiddenStateCacheSpec(" in lines[308 - 1]
    assert "eagle_aux_hidden_state_layer_ids" in lines[332 - 1]
    assert "CacheOnlyAttentionLayer(" in lines[348 - 1]
    interface = ast.parse(_source(release, "v1/kv_cache_interface.py"))
    spec = next(c for c in ast.walk(interface) if isinstance(c, ast.ClassDef) and c.name == "HiddenStateCacheSpec")
    assert [b.id for b in spec.bases if isinstance(b, ast.Name)] == ["MLAAttentionSpec"]
