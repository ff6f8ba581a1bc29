"""TRITON_MLA's decode workspace, claimed inside the memory profile from vLLM 0.33
(kvwatch/vllm_releases/mla_workspace.py): the size computed by the release's own functions, and the
plan's budget moved by exactly that size.

The oracle compiles, from each release's triton_mla.py (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...),
TritonMLAImpl.reserve_workspace, _reserve_attn_logits_workspace, _compute_num_kv_splits and its
constants, and from its v1/attention/backend.py max_decode_query_len; what they reach outside
themselves is stubbed (the card's multiprocessor count, the workspace manager, which records the
shapes asked of it, triton.next_power_of_2). Nothing of vLLM is imported or copied.
"""
from __future__ import annotations

import ast
import math
import re
from types import SimpleNamespace
from typing import Any

import pytest
from engine_support import deepseek_v2_config
from vllm_sources import release_tree_or_skip

from kvwatch.planner.devices import CARDS, MULTIPROCESSORS, Device, GiB, multiprocessors, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.gpu_budget import moe_workspace_bytes
from kvwatch.planner.kv_memory import kv_memory
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.mla_workspace import (
    RESERVED_IN_PROFILE,
    decode_logits_bytes,
    num_kv_splits,
    reserved_in_profile,
)

TRITON_MLA = "vllm/v1/attention/backends/mla/triton_mla.py"
PROFILE_CALL = "vllm/model_executor/layers/attention/mla_attention.py"


def _source(release: str, path: str) -> str:
    return (release_tree_or_skip(release, path) / path).read_text(encoding="utf-8")


def _top_level(tree: ast.Module, names: set[str]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            out.append(node)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            out.append(node)
    return out


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    owner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next((n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


class _Recorder:
    """The workspace manager as reserve_workspace meets it: it records each get_simultaneous call."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[tuple[int, ...], Any], ...]] = []

    def get_simultaneous(self, *shapes_and_dtypes: tuple[tuple[int, ...], Any]) -> None:
        self.calls.append(shapes_and_dtypes)


def release_reserve(release: str, max_num_seqs: int, heads_per_rank: int, kv_lora_rank: int, max_model_len: int,
                    sm_count: int) -> list[tuple[tuple[int, ...], Any]]:
    """The shapes the release's TritonMLAImpl.reserve_workspace asks of the workspace manager."""
    tree = ast.parse(_source(release, TRITON_MLA))
    backend = ast.parse(_source(release, "vllm/v1/attention/backend.py"))
    method = _method(tree, "TritonMLAImpl", "reserve_workspace")
    assert method is not None, f"vLLM {release}: TritonMLAImpl has no reserve_workspace"
    recorder = _Recorder()
    float32 = SimpleNamespace(itemsize=4, name="float32")
    namespace: dict[str, Any] = {
        "VllmConfig": object, "torch": SimpleNamespace(float32=float32),
        "triton": SimpleNamespace(next_power_of_2=lambda n: 1 << (n - 1).bit_length()),
        "current_platform": SimpleNamespace(num_compute_units=lambda: sm_count),
        "is_workspace_manager_initialized": lambda: True, "current_workspace_manager": lambda: recorder,
    }
    body = _top_level(tree, {"_MIN_WORK_PER_SPLIT", "_SPLIT_OCCUPANCY_MULTIPLIER", "_compute_num_kv_splits",
                             "_reserve_attn_logits_workspace"})
    body += _top_level(backend, {"max_decode_query_len"})
    exec(compile(ast.Module(body=[*body, method], type_ignores=[]), f"vLLM {release}", "exec"), namespace)
    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len),
                             scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs), speculative_config=None)
    impl = SimpleNamespace(_vllm_config=config, num_heads=heads_per_rank, dcp_world_size=1,
                           kv_lora_rank=kv_lora_rank, decode_sliding_window=None)
    namespace["reserve_workspace"](impl)
    assert len(recorder.calls) == 1
    return list(recorder.calls[0])


def view_alignment(release: str) -> int:
    """The alignment get_simultaneous rounds each tensor up to (v1/worker/workspace.py)."""
    text = _source(release, "vllm/v1/worker/workspace.py")
    match = re.search(r"round_up\(actual, (\w+)\)", text)
    assert match is not None
    value = match[1]
    if not value.isdigit():
        found = re.search(rf"^{value} = (\d+)$", text, re.M)
        assert found is not None
        value = found[1]
    return int(value)


# (max_num_seqs, heads per rank, kv_lora_rank, max_model_len, multiprocessors): short and long contexts,
# below and above the cap of two splits per multiprocessor (A100 108, L40S 142, RTX 5090 170)
CASES = [(1024, 16, 512, 163840, 108), (256, 128, 512, 163840, 142), (1024, 4, 512, 4096, 108),
         (128, 8, 512, 511, 170), (512, 16, 512, 32768, 170), (1, 1, 64, 1 << 20, 108)]


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("case", CASES)
def test_the_workspace_is_the_one_the_releases_reserve_workspace_asks_for(release: str, case: tuple) -> None:
    seqs, heads, rank, max_len, sms = case
    asked = release_reserve(release, seqs, heads, rank, max_len, sms)
    align = view_alignment(release)
    expected = sum(-(-math.prod(shape) * dtype.itemsize // align) * align for shape, dtype in asked)
    assert decode_logits_bytes(seqs, heads, rank, max_len, sms) == expected
    assert num_kv_splits(max_len, sms) == asked[0][0][2]


@pytest.mark.parametrize("release, claimed", [("0.25.1", False), ("0.32.0", False), ("0.33.0", True),
                                               ("0.34.0", True)])
def test_the_profile_claims_it_from_033(release: str, claimed: bool) -> None:
    """0.25-0.32 reserve only in the metadata builder (after the profile); from 0.33 the MLA layer's
    profile pass calls impl.reserve_workspace, which TRITON_MLA overrides."""
    tree = ast.parse(_source(release, TRITON_MLA))
    overrides = _method(tree, "TritonMLAImpl", "reserve_workspace") is not None
    called = "self.impl.reserve_workspace()" in _source(release, PROFILE_CALL)
    assert overrides == called == claimed
    assert reserved_in_profile("TRITON_MLA", parse_version(release).parts) == claimed
    assert not reserved_in_profile("FLASHMLA", parse_version(release).parts)


def test_the_boundary_cites_the_lines_of_the_method() -> None:
    text = _source("0.33.0", TRITON_MLA).splitlines()
    first, last = map(int, RESERVED_IN_PROFILE.source.rsplit(":", 1)[1].split("-"))
    assert text[first - 1].strip() == "def reserve_workspace(self) -> None:"
    assert text[last - 1].strip() == ")"
    assert "_reserve_attn_logits_workspace" in "\n".join(text[first - 1:last])


def _long_mla(heads: int = 16, layers: int = 2, moe: bool = False) -> dict:
    """A dense MLA model of `heads` query heads and DeepSeek's 160K context (with `moe`: every layer MoE)."""
    config = {**deepseek_v2_config(layers), "num_attention_heads": heads, "num_key_value_heads": heads,
              "max_position_embeddings": 163840}
    if moe:
        return {**config, "first_k_dense_replace": 0}
    return {k: v for k, v in config.items()
            if k not in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size")}


def _planned(config: dict, release: str, device: Device, *flags: str):
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags], release).settings()
    memory = MemoryInputs(vllm_version=parse_version(release))
    geometry = geometry_from_config(config)
    plan = make_plan(geometry, settings, device, ruleset_for(release), memory)
    without = kv_memory(device, settings, geometry, memory, plan.dtype_bytes, backend=None)[3]
    assert plan.gpu_budget is not None and without is not None
    return plan, without


@pytest.mark.parametrize("card, tp", [("a100-80g", 1), ("a100-80g", 2), ("l40s", 1), ("rtx-5090", 1)])
def test_033_takes_the_workspace_from_the_kv_cache_where_triton_mla_serves(card: str, tp: int) -> None:
    device = preset(card)
    plan, without = _planned(_long_mla(), "0.33.0", device, "--tensor-parallel-size", str(tp))
    assert plan.backend == "TRITON_MLA"
    budget = plan.gpu_budget
    assert budget is not None and without.kv_cache_bytes > 0
    workspace = release_reserve("0.33.0", budget.max_num_seqs, 16 // tp, 512, plan.max_model_len,
                                multiprocessors(device) or 0)
    reserved = math.prod(workspace[0][0]) * 4
    assert reserved > GiB // 4   # enough to matter: 256 x 16 x 216 x 513 x 4 B, 1.7 GiB, on one A100
    assert budget.activation_peak_bytes - without.activation_peak_bytes == reserved
    assert without.kv_cache_bytes - budget.kv_cache_bytes == min(reserved, without.kv_cache_bytes)


def test_034_keeps_it_free_as_part_of_the_transient_peak() -> None:
    device = preset("a100-80g")
    plan, without = _planned(_long_mla(), "0.34.0", device)
    budget = plan.gpu_budget
    assert plan.backend == "TRITON_MLA" and budget is not None and budget.extensible is not None
    reserved = decode_logits_bytes(budget.max_num_seqs, 16, 512, plan.max_model_len, 108)
    assert budget.transient_bytes - without.transient_bytes == reserved
    off, off_without = _planned(_long_mla(), "0.34.0", device, "--no-enable-extensible-kv-cache")
    assert off.gpu_budget is not None
    assert off_without.kv_cache_bytes - off.gpu_budget.kv_cache_bytes == reserved


@pytest.mark.parametrize("card, release", [("a100-80g", "0.32.0"), ("h100", "0.33.0"), ("b200", "0.34.0")])
def test_no_workspace_before_033_or_for_another_mla_backend(card: str, release: str) -> None:
    plan, without = _planned(_long_mla(), release, preset(card))
    assert plan.gpu_budget == without
    assert (plan.backend == "TRITON_MLA") == (release == "0.32.0")


def test_the_moe_workspaces_share_its_buffer() -> None:
    """One buffer, grown to the largest request: the profile keeps the larger of the two."""
    config = _long_mla(moe=True)
    plan, without = _planned(config, "0.33.0", preset("a100-80g"))
    budget = plan.gpu_budget
    assert budget is not None
    count = geometry_from_config(config).weight_count
    moe = moe_workspace_bytes(count, budget.max_num_batched_tokens, 2, 1)
    mla = decode_logits_bytes(budget.max_num_seqs, 16, 512, plan.max_model_len, 108)
    assert 0 < moe < mla
    assert budget.activation_peak_bytes - without.activation_peak_bytes == mla - moe


def test_the_multiprocessor_counts_are_for_cards_of_the_table() -> None:
    assert set(MULTIPROCESSORS) <= {c.key for c in CARDS}
    assert multiprocessors(preset("a100-40g")) == 108 and multiprocessors(Device("cpu", "cpu")) is None
    assert multiprocessors(Device("cuda", "NVIDIA Some Future Card", (11, 0))) is None
    assert num_kv_splits(163840, None) == 512   # no count known: the uncapped splits, never fewer than vLLM's
