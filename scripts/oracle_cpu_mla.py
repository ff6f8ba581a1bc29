#!/usr/bin/env python3
"""Run one vLLM release's own CPU attention-backend selection for MLA models, on any host.

    python scripts/oracle_cpu_mla.py RELEASE_TREE < cases.json
    python scripts/oracle_cpu_mla.py --installed < cases.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...). The function is the release's own
`CpuPlatform.get_attn_backend_cls` (vllm/platforms/cpu.py), its source taken from the file and run
with stand-ins for what it reads of the host and of vLLM: the CPU's architecture (x86 here),
`torch.cpu._is_amx_tile_supported()` (the case's `amx`: /proc/cpuinfo amx_tile), the attention
backend enum (a name per member, `get_path()` the name) and the selector's config (`use_mla`,
`use_sparse`, `head_size`, `kv_cache_dtype` from the case). Each case also names the backend the
user asked for (`requested`, or null). The last line printed is a JSON list, one answer per case:
the backend's name, or "error: <type>: <message>" where the function raises. Alongside, the head
sizes each CPU MLA backend of the release declares (`get_supported_head_sizes`, run the same way).
With --installed, the installed vLLM's own modules are imported instead and only the host's answer to
`_is_amx_tile_supported` is the case's (the answer then also names the installed version); and
CPU_MLA's decode kernel (`torch.ops._C.mla_decode_kvcache`, what cpu_mla.py calls) is run on one
16-token block of each head size in KERNEL_HEADS: "ok", or the exception it raises.
"""
from __future__ import annotations

import ast
import enum
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any


class _Member:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_path(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


class _Enum:
    """AttentionBackendEnum: any member asked for, compared by identity as the release's enum is."""
    def __init__(self) -> None:
        self._members: dict[str, _Member] = {}

    def __getattr__(self, name: str) -> _Member:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._members.setdefault(name, _Member(name))


class _Logger:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _method(tree: ast.Module, cls: str, name: str) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    item.decorator_list = []
                    return ast.unparse(item)
    raise LookupError(f"{cls}.{name}")


def _select(source: str, backends: _Enum, case: dict[str, Any]) -> str:
    arch = enum.Enum("CpuArchEnum", "X86 ARM POWERPC S390X RISCV OTHER")
    torch = types.SimpleNamespace(cpu=types.SimpleNamespace(_is_amx_tile_supported=lambda: case["amx"]))
    namespace: dict[str, Any] = {"torch": torch, "AttentionBackendEnum": backends, "CpuArchEnum": arch,
                                 "logger": _Logger()}
    exec(compile(source, "get_attn_backend_cls", "exec"), namespace)   # noqa: S102 - the release's own code
    platform = types.SimpleNamespace(get_cpu_architecture=lambda: arch.X86)
    config = types.SimpleNamespace(use_mla=True, use_sparse=False, head_size=case["head_size"],
                                   kv_cache_dtype=case.get("kv_cache_dtype", "auto"))
    requested = getattr(backends, case["requested"]) if case["requested"] else None
    try:
        return str(namespace["get_attn_backend_cls"](platform, requested, config))
    except Exception as e:   # what the release raises while choosing
        return f"error: {type(e).__name__}: {e}"


def _head_sizes(tree_root: Path) -> dict[str, list[int]]:
    out = {}
    for name, path, cls in (("CPU_MLA", "v1/attention/backends/mla/cpu_mla.py", "CPUMLABackend"),
                            ("AMX_MLA", "v1/attention/backends/mla/amx_mla.py", "AMXMLABackend")):
        file = tree_root / "vllm" / path
        if not file.exists():
            continue
        namespace: dict[str, Any] = {}
        exec(compile(_method(ast.parse(file.read_text()), cls, "get_supported_head_sizes"), str(file), "exec"),
             namespace)   # noqa: S102
        out[name] = namespace["get_supported_head_sizes"](None)
    return out


KERNEL_HEADS = ((576, 512), (288, 256), (320, 256))   # (latent, its kv_lora_rank): DeepSeek's, MiniCPM3's, another


def _kernel(head: int, rank: int) -> str:
    import torch
    query = torch.randn(1, 4, head, dtype=torch.bfloat16)
    out = torch.zeros(1, 4, rank, dtype=torch.bfloat16)
    cache = torch.randn(2, 16, head, dtype=torch.bfloat16)
    blocks = torch.tensor([[0, 1]], dtype=torch.int32)
    try:
        torch.ops._C.mla_decode_kvcache(out, query, cache, head ** -0.5, blocks, torch.tensor([20], dtype=torch.int32))
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return "ok"


def _installed(cases: list[dict[str, Any]]) -> dict[str, Any]:
    import logging

    import torch
    import vllm
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.mla.amx_mla import AMXMLABackend
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    logging.disable(logging.CRITICAL)
    by_path = {}
    for member in AttentionBackendEnum:
        try:
            by_path[member.get_path()] = member.name
        except ValueError:   # a backend this build does not register
            continue
    answers = []
    for case in cases:
        torch.cpu._is_amx_tile_supported = lambda case=case: case["amx"]
        config = types.SimpleNamespace(use_mla=True, use_sparse=False, head_size=case["head_size"],
                                       kv_cache_dtype=case.get("kv_cache_dtype", "auto"))
        requested = AttentionBackendEnum[case["requested"]] if case["requested"] else None
        try:
            answers.append(by_path[CpuPlatform.get_attn_backend_cls(requested, config)])
        except Exception as e:
            answers.append(f"error: {type(e).__name__}: {e}")
    return {"vllm": vllm.__version__, "answers": answers,
            "cpu_mla_kernel": {str(head): _kernel(head, rank) for head, rank in KERNEL_HEADS},
            "head_sizes": {"CPU_MLA": CPUMLABackend.get_supported_head_sizes(),
                           "AMX_MLA": AMXMLABackend.get_supported_head_sizes()}}


def main() -> None:
    if sys.argv[1] == "--installed":
        print(json.dumps(_installed(json.load(sys.stdin))))
        return
    root = Path(sys.argv[1])
    tree = ast.parse((root / "vllm" / "platforms" / "cpu.py").read_text())
    source = textwrap.dedent(_method(tree, "CpuPlatform", "get_attn_backend_cls"))
    cases = json.load(sys.stdin)
    answers = [_select(source, _Enum(), case) for case in cases]
    print(json.dumps({"head_sizes": _head_sizes(root), "answers": answers}))


if __name__ == "__main__":
    main()
