"""Where the tests find an unpacked vLLM release (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...), and the
oracles that run a release's own code from it, or their answers recorded from such a run."""
from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest


def release_tree(release: str, needs: str = "vllm") -> Path | None:
    """<root>/<release> where KVWATCH_VLLM_SRC holds the release's `needs` (a path under the tree)."""
    root = os.environ.get("KVWATCH_VLLM_SRC")
    tree = Path(root) / release if root else None
    return tree if tree is not None and (tree / needs).exists() else None


def release_tree_or_skip(release: str, needs: str = "vllm") -> Path:
    """release_tree(), or the test skips saying how to unpack the release."""
    tree = release_tree(release, needs)
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    return tree


def unpacked_root(releases: Iterable[str], needs: str = "vllm") -> Path | None:
    """KVWATCH_VLLM_SRC where it holds every one of `releases` (with `needs`), else None."""
    trees = [release_tree(r, needs) for r in releases]
    return trees[0].parent if trees and all(trees) and trees[0] is not None else None


def oracle_answers(script: Path, release: str, cases: dict[str, dict[str, Any]], record: Path) -> dict[str, Any]:
    """The answers of `script` (run on the unpacked release with the cases as JSON, its last line a JSON
    list, one answer per case) by case name; the answers recorded in `record` where the release is not
    unpacked here."""
    tree = release_tree(release)
    if tree is None:
        return json.loads(record.read_text())[release]   # type: ignore[no-any-return]
    out = subprocess.run([sys.executable, str(script), str(tree), json.dumps(list(cases.values()))],
                         capture_output=True, text=True, timeout=600, check=True)
    return dict(zip(cases, json.loads(out.stdout.strip().splitlines()[-1]), strict=True))


class SpecOracle:
    """A script that runs a release's own KV cache spec and sizing code on cases given as JSON (stdin), one
    answer each (stdout), and the answers recorded from it per release in `fixture` ({"cases", "answers"}
    by release), for the tests that check kvwatch against them without the sources."""

    def __init__(self, script: Path, fixture: Path, source: str) -> None:
        self.script, self.fixture, self.source = script, fixture, source

    def recorded(self) -> dict[str, Any]:
        recorded: dict[str, Any] = json.loads(self.fixture.read_text())
        return recorded

    def run(self, tree: Path, cases: list[dict[str, Any]]) -> list[Any]:
        done = subprocess.run([sys.executable, str(self.script), str(tree)], input=json.dumps(cases),
                              capture_output=True, text=True, check=True, timeout=300)
        answers: list[Any] = json.loads(done.stdout)
        return answers

    @staticmethod
    def tree(release: str) -> Path | None:
        return release_tree(release, "vllm/v1/kv_cache_interface.py")

    def check_live(self, release: str) -> None:
        """The release's code, where it is unpacked here, gives the recorded answers."""
        tree = self.tree(release)
        if tree is None:
            pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
        pytest.importorskip("torch")
        recorded = self.recorded()
        assert self.run(tree, recorded["cases"][release]) == recorded["answers"][release]

    def record(self, cases: dict[str, list[dict[str, Any]]]) -> None:
        """Run the oracle on every release's cases and write the fixture (KVWATCH_VLLM_SRC must name them)."""
        answers = {}
        for release, release_cases in cases.items():
            found = self.tree(release)
            assert found is not None, f"vLLM {release} is not unpacked under KVWATCH_VLLM_SRC"
            answers[release] = self.run(found, release_cases)
        self.fixture.write_text(json.dumps({"source": self.source, "cases": cases, "answers": answers}, indent=1) + "\n")


def packed_answer(config: Any, specs: dict[str, Any], kv_memory_bytes: int, planning: Any, utils: Any) -> dict[str, Any]:
    """A packed oracle's answer for one case: the release's get_kv_cache_groups of the layers' `specs`,
    get_kv_cache_config_from_groups for the KV budget and get_kv_cache_capacity for the tokens it logs
    (`planning` and `utils` are its vllm.v1.core kv_cache_planning and kv_cache_utils)."""
    cache = config.cache_config
    groups = planning.get_kv_cache_groups(config, specs)
    planned = planning.get_kv_cache_config_from_groups(config, groups, kv_memory_bytes)
    return {
        "block_size": cache.block_size, "layout": cache.kv_cache_layout,
        "groups": [{"type": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
                    "block_size": g.kv_cache_spec.block_size,
                    "page_size_bytes": g.kv_cache_spec.page_size_bytes} for g in groups],
        "bytes_per_block": planning._get_kv_cache_bytes_per_block(groups, cache.get_resolved_kv_cache_layout()),
        "num_blocks": planned.num_blocks, "tokens": utils.get_kv_cache_capacity(config, planned)[0]}


def bare_vllm_config(cache: Any, model: Any, tp: int, k: int = 0, scheduler: dict[str, Any] | None = None,
                     **extra: Any) -> Any:
    """The VllmConfig attributes the releases' spec, block-size and grouping code reads, as a namespace:
    the cache and model configs given, TP `tp`, the hybrid manager on, no context parallelism, and a
    speculative config of `k` tokens where k > 0 (`scheduler`: more scheduler fields; `extra`: more
    top-level ones)."""
    ns = types.SimpleNamespace
    return ns(cache_config=cache, model_config=model, compilation_config=ns(static_forward_context={}),
              scheduler_config=ns(disable_hybrid_kv_cache_manager=False, **(scheduler or {})),
              attention_config=ns(hisparse_config=None), num_gpu_blocks_override=None,
              parallel_config=ns(tensor_parallel_size=tp, decode_context_parallel_size=1, prefill_context_parallel_size=1),
              speculative_config=ns(num_speculative_tokens=k) if k else None, num_speculative_tokens=k, **extra)


def bare_layer(cls: type, **attrs: Any) -> Any:
    """A layer of `cls` with only the attributes its get_kv_cache_spec reads: its constructor, which
    wants a GPU and a model, is skipped (an nn.Module's own bookkeeping set up first)."""
    from torch import nn
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    for k, v in attrs.items():
        object.__setattr__(layer, k, v)
    return layer


def run_oracle_script(main: Callable[[Path, list[dict[str, Any]]], list[Any]]) -> None:
    """An oracle script's entry: main(<unpacked release root>, <cases as JSON>) printed as JSON."""
    print(json.dumps(main(Path(sys.argv[1]), json.loads(sys.argv[2]))))


def _bare_package(root: Path, name: str, attrs_from: str = "") -> None:
    """Package `name` of the release registered without running its __init__: its submodules import from
    the release's files; `attrs_from`: a submodule its own names resolve from."""
    package = types.ModuleType(name)
    package.__path__ = [str(root.joinpath(*name.split(".")))]
    package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    package.__spec__.submodule_search_locations = package.__path__
    if attrs_from:
        package.__getattr__ = lambda attr: getattr(  # type: ignore[attr-defined]
            importlib.import_module(f"{name}.{attrs_from}"), attr)
    sys.modules[name] = package


def cpu_imports(root: Path, *bare: str) -> None:
    """What lets a CUDA-only model module import on this CPU (no answer calls a kernel), after the release
    is first on sys.path: vllm_flash_attn's __init__ refuses to import without the CUDA flash-attention
    extensions, so it is registered without it, as are the `bare` packages (a model package whose
    __init__ imports what needs CUDA libraries, such as models/dots3_note's vision tower and its
    DeepGEMM extension); fa_utils has no compile_flash_attn_varlen_func_from_specs off CUDA and gets the
    None its XPU and ROCm branches set (v1/attention/backends/fa_utils.py:22-45), and None for the
    kernels its CUDA branch binds from vllm_flash_attn (:22-27), which a backend module such as
    mla/flashattn_mla.py imports by name but no answer calls."""
    _bare_package(root, "vllm.vllm_flash_attn", "flash_attn_interface")
    for name in bare:
        _bare_package(root, name)
    from vllm.v1.attention.backends import fa_utils
    if not hasattr(fa_utils, "compile_flash_attn_varlen_func_from_specs"):
        fa_utils.compile_flash_attn_varlen_func_from_specs = None
    for kernel in ("flash_attn_varlen_func", "get_scheduler_metadata"):
        if not hasattr(fa_utils, kernel):
            setattr(fa_utils, kernel, None)
