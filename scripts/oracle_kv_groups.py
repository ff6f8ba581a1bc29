#!/usr/bin/env python3
"""Run one vLLM release's own `get_kv_cache_groups` on KV cache specs built with that release's own
spec classes (`vllm/v1/kv_cache_interface.py`), on this CPU, in a process of its own.

    python scripts/oracle_kv_groups.py RELEASE_TREE < cases.json > answers.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...). Run by scripts/check_release_functions.py
(the kv_groups check), one process per release so that releases' modules never mix. Needs torch (the
spec classes hold torch dtypes); nothing of vLLM is installed: the spec and grouping modules are loaded
from the release's files, every other vllm module they import is a stand-in (its names are inert
objects), `init_logger` is the standard logger and `get_dtype_size` is torch's element size.

Each case (see check_release_functions.GROUP_CASES) gives the layers as kinds and shapes; the answer
is the groups vLLM forms: per group its spec kind, block size, layer indices and bytes per block (the
group's layers' pages), or "error: <exception type>" when vLLM refuses the specs.

    python scripts/oracle_kv_groups.py RELEASE_TREE --tokens NUM_BLOCKS < cases.json > answers.json

answers instead the "GPU KV cache size: N tokens" the release logs for a cache of NUM_BLOCKS blocks
in those groups (its own reporting function: `_report_kv_cache_config`, 0.28+ `update_kv_cache_capacity`,
run on a KVCacheConfig of its own class, the line read from its logger; 0.24-0.27 log the count of
`get_kv_cache_capacity` inline, which is run instead); None for 0.10 (the line is inside
`get_kv_cache_config`, which sizes the cache from memory itself).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

# The modules loaded from the release's own files; every other vllm module is a stand-in.
REAL = {"vllm.v1.kv_cache_interface", "vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_planning",
        "vllm.utils.math_utils", "vllm.v1.kv_cache_layout", "vllm.v1.kv_cache_spec_registry",
        "vllm.v1.core.kv_cache_config_builder", "vllm.v1.core.single_type_kv_cache_manager"}
# Where get_kv_cache_groups lives: 0.33 moved it to kv_cache_planning.py.
GROUPING_MODULES = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")
# A layer-outermost layout: vLLM's default preference (vLLM 0.32.0,
# vllm/v1/attention/backends/utils.py:195), so the block-outermost packed grouping does not apply.
LAYOUT = "LBNHC"


class Inert:
    """A name imported from a stand-in module: attributes and calls give more of it, a decorator
    returns what it decorates, a base class is object, and it is false."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> Inert:
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return Inert(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __getitem__(self, key: Any) -> Inert:
        return self

    def __or__(self, other: Any) -> Inert:
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = Inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class ReleaseFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "vllm" and not name.startswith("vllm."):
            return None
        if name in REAL:
            file = self.tree / (name.replace(".", "/") + ".py")
            if file.exists():
                return importlib.util.spec_from_file_location(name, file)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        import torch
        if module.__name__ == "vllm.logger":
            module.init_logger = logging.getLogger   # type: ignore[attr-defined]
        elif module.__name__ in ("vllm.utils.torch_utils", "vllm.utils"):   # 0.10: vllm/utils/__init__.py
            module.get_dtype_size = lambda dtype: torch.empty((), dtype=dtype).element_size()   # type: ignore[attr-defined]
        if module.__name__ == "vllm.utils":   # 0.10 keeps its arithmetic there too
            module.cdiv = lambda a, b: -(-a // b)   # type: ignore[attr-defined]
            module.GiB_bytes = 1 << 30   # type: ignore[attr-defined]


# 0.10's get_kv_cache_config also sizes the cache: enough memory for any case at this length.
MEMORY, MAX_MODEL_LEN = 1 << 40, 4096


def _config(case: dict[str, Any], layout: Any) -> Any:
    """The VllmConfig the grouping reads: the hybrid manager switch and the resolved layout (0.10:
    what sizing the cache reads too)."""
    return types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=case["disable_hybrid"],
                                               max_num_batched_tokens=2048, max_model_len=MAX_MODEL_LEN),
        model_config=types.SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        device_config=types.SimpleNamespace(device_type="cuda"),
        attention_config=types.SimpleNamespace(hisparse_config=None),
        cache_config=types.SimpleNamespace(kv_cache_layout=LAYOUT, get_resolved_kv_cache_layout=lambda: layout,
                                           mamba_cache_mode="align", num_gpu_blocks_override=None,
                                           block_size=case["block_size"]),
        speculative_config=None, kv_transfer_config=None,
        max_in_flight_tokens=2048,   # max_concurrent_batches (1: no pipeline stages) x max_num_batched_tokens
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, decode_context_parallel_size=1,
                                              prefill_context_parallel_size=1, pipeline_parallel_size=1))


def _make(cls: Any, **fields: Any) -> Any:
    """A spec with the fields this release's class has (mamba_cache_mode is 0.12+: before, there is
    no prefix caching on Mamba layers, the same as "align" for grouping)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in known})


def _specs(ki: Any, case: dict[str, Any]) -> dict[str, Any]:
    import torch
    bf16 = torch.bfloat16
    specs = {}
    block = case["block_size"]
    for index, layer in enumerate(case["layers"]):
        if layer is None:   # a KV-shared layer: it reads another layer's cache and has no spec
            continue
        kind = layer["kind"]
        if kind == "mamba":
            spec = _make(ki.MambaSpec, block_size=block, shapes=tuple(tuple(s) for s in layer["shapes"]),
                         dtypes=(bf16,) * len(layer["shapes"]), page_size_padded=layer["page_padded"],
                         mamba_cache_mode="align")
        else:
            # a quantized layer beside skip layers kept in bf16: fp8 as --kv-cache-dtype fp8 makes it
            fp8 = layer.get("dtype") == "fp8"
            common = {"block_size": block, "num_kv_heads": layer["heads"], "head_size": layer["head_size"],
                      "dtype": torch.float8_e4m3fn if fp8 else bf16, "use_mla": kind == "mla"}   # use_mla: 0.10's
            if kind == "full":
                spec = _make(ki.FullAttentionSpec, **common)
            elif kind == "mla":
                spec = _make(getattr(ki, "MLAAttentionSpec", ki.FullAttentionSpec), **common,
                             cache_dtype_str="fp8" if fp8 else "auto")
            elif kind == "sliding":
                spec = _make(ki.SlidingWindowSpec, **common, sliding_window=layer["window"])
            elif kind == "chunked":
                spec = _make(ki.ChunkedLocalAttentionSpec, **common, attention_chunk_size=layer["window"])
            else:
                raise SystemExit(f"unknown layer kind {kind!r}")
        specs[f"model.layers.{index}.self_attn.attn"] = spec
    return specs


KINDS = {"FullAttentionSpec": "full", "MLAAttentionSpec": "full", "SlidingWindowSpec": "sliding",
         "SlidingWindowMLASpec": "sliding", "ChunkedLocalAttentionSpec": "chunked", "MambaSpec": "mamba"}


def _kind(spec: Any) -> str:
    name = type(spec).__name__
    if name == "UniformTypeKVCacheSpecs":
        kinds = {_kind(s) for s in spec.kv_cache_specs.values()}
        assert len(kinds) == 1, kinds
        return kinds.pop()
    return KINDS[name]


def _group(group: Any) -> dict[str, Any]:
    spec = group.kv_cache_spec
    layers = [int(name.split(".")[2]) for name in group.layer_names]
    if type(spec).__name__ == "UniformTypeKVCacheSpecs":
        page = spec.page_size_bytes
    else:
        page = spec.page_size_bytes * len(layers)
    return {"kind": _kind(spec), "block_size": spec.block_size, "layers": layers, "bytes_per_block": page}


class _LogLine(logging.Handler):
    """Keeps the token count of the release's "KV cache size: N tokens" line."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "KV cache size: " in text and " tokens" in text:
            self.tokens = int(text.split("KV cache size: ", 1)[1].split(" tokens", 1)[0].replace(",", ""))


def _once(logger: logging.Logger) -> None:
    """vLLM's logger has info_once/warning_once; the standard one stands in."""
    def once(emit: Any) -> Any:
        return lambda msg, *args, scope=None: emit(msg, *args)
    for level in ("info", "warning", "debug"):
        setattr(logger, f"{level}_once", once(getattr(logger, level)))


def sized_answer(tree: Path, config: Any, groups: list[Any], memory: int, planning: Any, utils: Any,
                 group_fields: Any = None) -> dict[str, Any]:
    """vLLM's KV cache config of `groups` for `memory` bytes, as the grouping oracles answer it: per scheduler
    group its spec, layers and blocks a request (and `group_fields(group)`), then the blocks, the bytes a
    block, the concurrency and the tokens vLLM logs (`planning` and `utils`: the release's modules)."""
    kv_cache_config = planning.get_kv_cache_config_from_groups(config, groups, memory)
    scheduler_groups = utils.generate_scheduler_kv_cache_config([kv_cache_config]).kv_cache_groups
    return {
        "groups": [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
                    **(group_fields(g) if group_fields else {}),
                    "blocks_per_request": -(-g.kv_cache_spec.max_memory_usage_bytes(config)
                                            // g.kv_cache_spec.page_size_bytes)} for g in scheduler_groups],
        "num_blocks": kv_cache_config.num_blocks,
        "bytes_per_block": kv_cache_config.kv_cache_tensors[0].size // kv_cache_config.num_blocks,
        "max_concurrency": utils.get_max_concurrency_for_kv_cache_config(config, kv_cache_config),
        "kv_cache_tokens": _reported_tokens(tree, config, groups, kv_cache_config.num_blocks),
    }


def _reported_tokens(tree: Path, config: Any, groups: list[Any], num_blocks: int) -> int | None:
    ki = importlib.import_module("vllm.v1.kv_cache_interface")
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    report = getattr(utils, "update_kv_cache_capacity", None) or getattr(utils, "_report_kv_cache_config", None)
    kv_cache_config = _make(ki.KVCacheConfig, num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    if report is None:
        # 0.24-0.27 log it inline in get_kv_cache_configs, the count being get_kv_cache_capacity's
        # (vLLM 0.24.0, vllm/v1/core/kv_cache_utils.py:2146)
        capacity = getattr(utils, "get_kv_cache_capacity", None)
        return int(capacity(config, kv_cache_config)[0]) if capacity is not None else None
    handler = _LogLine()
    logger = utils.logger
    _once(logger)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logging.disable(logging.NOTSET)
    try:
        report(config, kv_cache_config)
    finally:
        logger.removeHandler(handler)
        logging.disable(logging.WARNING)
    return handler.tokens


def main() -> int:
    tree = Path(sys.argv[1])
    tokens_for = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--tokens" else None
    sys.meta_path.insert(0, ReleaseFinder(tree))
    logging.disable(logging.WARNING)
    cases = json.load(sys.stdin)
    name = next((m for m in GROUPING_MODULES if (file := tree / (m.replace(".", "/") + ".py")).exists()
                 and "def get_kv_cache_groups(" in file.read_text(encoding="utf-8")), None)
    utils = tree / "vllm" / "v1" / "core" / "kv_cache_utils.py"
    if name is None and utils.exists() and "def get_kv_cache_config(" in utils.read_text(encoding="utf-8"):
        name = "vllm.v1.core.kv_cache_utils"   # 0.10: the grouping is inside get_kv_cache_config
    if name is None:
        json.dump(None, sys.stdout)
        return 0
    grouping = importlib.import_module(name)
    group = getattr(grouping, "get_kv_cache_groups", None) or \
        (lambda config, specs: grouping.get_kv_cache_config(config, specs, MEMORY).kv_cache_groups)
    ki = importlib.import_module("vllm.v1.kv_cache_interface")
    layout_module = tree / "vllm" / "v1" / "kv_cache_layout.py"
    layout = getattr(importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout, LAYOUT) \
        if layout_module.exists() else None
    answers: list[Any] = []
    if tokens_for is not None and not hasattr(grouping, "get_kv_cache_groups"):
        json.dump(None, sys.stdout)   # 0.10: no grouping without sizing
        return 0
    for case in cases:
        try:
            config = _config(case, layout)
            groups = group(config, _specs(ki, case))
            if tokens_for is not None:
                answers.append(_reported_tokens(tree, config, groups, tokens_for))
                continue
            answers.append([_group(g) for g in groups])
        except (ValueError, NotImplementedError, AssertionError) as exc:   # a refusal is an answer too
            if os.environ.get("KVWATCH_ORACLE_TRACE"):
                traceback.print_exc()
            answers.append(f"error: {type(exc).__name__}")
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
