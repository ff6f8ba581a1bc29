"""The import contract (docs/architecture.md): the layers, and the pure core.

The layers (pyproject.toml's [tool.importlinter] contract, below): each imports only the layers under it.
The pure core: the planner and the diagnosis compute, they do no I/O.

They compute from values they are given; they never touch processes, sockets, files, threads, the
GPU or the engine. Everything that does lives in kvwatch.boundary (and is driven by
kvwatch.watchdog, kvwatch.exporter and kvwatch.commands). The check reads the source with `ast`, so
an import inside a function counts as much as one at the top, and nothing is imported to check it.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import ContractCheck

PACKAGE = Path(__file__).resolve().parent.parent / "kvwatch"

# The pure modules: every module of these packages, and these top-level ones.
PURE_PACKAGES = ("values", "planner", "diagnosis", "vllm_releases")
PURE_MODULES = ("errors.py", "policy.py", "exitcodes.py", "engine_status.py", "failure_kinds.py", "listen.py",
                "gpu_types.py", "exporter/sources.py", "exporter/eviction.py",
                # the watchdog's decisions and values: what the supervisor and the state file act on
                "watchdog/__init__.py", "watchdog/outcomes.py", "watchdog/records.py", "watchdog/recovery.py",
                "watchdog/budget.py", "watchdog/engine_ranks.py", "watchdog/launch_watch.py",
                "watchdog/memory_learning.py", "watchdog/progress.py", "watchdog/pressure_window.py",
                "watchdog/autopilot.py", "watchdog/pressure_watch.py", "watchdog/ownership.py",
                "watchdog/kill_cause.py", "watchdog/gpu_release.py",
                "watchdog/host_memory_watch.py", "watchdog/persisted_command.py", "watchdog/next_command.py",
                "watchdog/autopilot_record.py", "watchdog/reconcile.py")

# What a pure module must not import (a name here covers its submodules: "http" covers "http.client").
FORBIDDEN = {
    # processes, signals and the process environment (os.system, os.kill, os.environ, ...)
    "os": "processes and the environment (os.path's string functions are posixpath)",
    "subprocess": "processes",
    "signal": "processes",
    "multiprocessing": "processes",
    "psutil": "processes",
    "ctypes": "native calls (prctl, ...)",
    # the GPU
    "pynvml": "the GPU (NVML)",
    # the network
    "socket": "the network",
    "socketserver": "the network",
    "ssl": "the network",
    "select": "the network",
    "selectors": "the network",
    "urllib": "the network",
    "http": "the network",
    "asyncio": "the network and concurrency",
    # threads
    "threading": "threads",
    "_thread": "threads",
    "concurrent": "threads",
    # files
    "pathlib": "files",
    "shutil": "files",
    "tempfile": "files",
    # imports chosen at run time would hide from this check
    "importlib": "hidden imports",
    # the engine and its stack (the planner reasons about vLLM; it never loads it)
    "vllm": "the engine",
    "torch": "the engine",
    "transformers": "the engine",
    # kvwatch's own impure layers
    "kvwatch.boundary": "kvwatch's I/O boundary",
    "kvwatch.watchdog": "kvwatch's supervisor",
    "kvwatch.exporter": "kvwatch's exporter",
    "kvwatch.commands": "kvwatch's commands",
    "kvwatch.cli": "kvwatch's commands",
}

# Third-party boundaries that one module alone may import, anywhere in kvwatch.
SOLE_IMPORTERS = {
    "pynvml": "kvwatch/boundary/nvml.py",
    "psutil": "kvwatch/boundary/proc_inspect.py",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` imports, anywhere in it (functions and classes included): for
    `from a import b` both a and a.b, since b may be a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: resolved against the importing module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base:
                found.add(base)
            found.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names if alias.name != "*")
    return found


def forbidden_in(modules: set[str], pure: frozenset[str] = frozenset()) -> dict[str, str]:
    """The forbidden names among `modules`, less those of the pure modules `pure` (module names) and
    the names imported from them: a pure module of kvwatch.watchdog may import another pure one."""
    hits = {}
    for name in modules:
        parent = name.rpartition(".")[0]
        if name in pure or (parent in pure and parent not in PURE_PACKAGE_NAMES):
            continue
        for banned, why in FORBIDDEN.items():
            if name == banned or name.startswith(banned + "."):
                hits[name] = why
    return hits


def pure_files() -> list[Path]:
    files = [p for pkg in PURE_PACKAGES for p in sorted((PACKAGE / pkg).rglob("*.py"))]
    return files + [PACKAGE / name for name in PURE_MODULES]


def pure_names() -> frozenset[str]:
    return frozenset(module_name(p) for p in pure_files())


# Packages whose __init__ is pure: importing the package is allowed, not everything under it.
PURE_PACKAGE_NAMES = frozenset({"kvwatch.watchdog", "kvwatch.exporter"})


def all_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imports_of(path: Path) -> set[str]:
    return imported_modules(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_the_pure_modules_are_there() -> None:
    files = pure_files()
    assert all(p.is_file() for p in files), [rel(p) for p in files if not p.is_file()]
    names = {rel(p) for p in files}
    for expected in ("kvwatch/planner/geometry.py", "kvwatch/planner/plan.py", "kvwatch/planner/rules.py",
                     "kvwatch/diagnosis/diagnose.py", "kvwatch/diagnosis/remedies.py"):
        assert expected in names


@pytest.mark.parametrize("path", pure_files(), ids=rel)
def test_pure_module_imports_no_boundary(path: Path) -> None:
    hits = forbidden_in(imports_of(path), pure_names())
    assert not hits, f"{rel(path)} is pure but imports " + ", ".join(f"{m} ({why})" for m, why in sorted(hits.items()))


@pytest.mark.parametrize("library,owner", sorted(SOLE_IMPORTERS.items()))
def test_one_module_imports_each_native_boundary(library: str, owner: str) -> None:
    importers = sorted(rel(p) for p in all_files()
                       if any(m == library or m.startswith(library + ".") for m in imports_of(p)))
    assert importers == [owner]


# The checker itself: it must see what it is there to see.
@pytest.mark.parametrize("source,module,expected", [
    ("import subprocess", "kvwatch.planner.x", {"subprocess"}),
    ("import os.path", "kvwatch.planner.x", {"os.path"}),
    ("from os import system", "kvwatch.planner.x", {"os", "os.system"}),
    ("def f():\n    import socket\n", "kvwatch.planner.x", {"socket"}),
    ("class C:\n    def m(self):\n        from http.client import HTTPConnection\n", "kvwatch.diagnosis.x",
     {"http.client", "http.client.HTTPConnection"}),
    ("from kvwatch import watchdog", "kvwatch.planner.x", {"kvwatch", "kvwatch.watchdog"}),
    ("from ..boundary import nvml", "kvwatch.planner.x", {"kvwatch.boundary", "kvwatch.boundary.nvml"}),
    ("from . import rules", "kvwatch.planner", {"kvwatch.planner", "kvwatch.planner.rules"}),
])
def test_the_checker_sees_every_kind_of_import(source: str, module: str, expected: set[str]) -> None:
    is_package = module == "kvwatch.planner"
    assert imported_modules(source, module, is_package) == expected


def test_a_pure_watchdog_module_may_import_another_but_no_driver() -> None:
    pure = frozenset({"kvwatch.watchdog", "kvwatch.watchdog.records"})
    assert forbidden_in({"kvwatch.watchdog", "kvwatch.watchdog.records", "kvwatch.watchdog.records.Constraint"},
                        pure) == {}
    assert set(forbidden_in({"kvwatch.watchdog.supervisor", "kvwatch.watchdog.supervisor.Supervisor"}, pure)) == {
        "kvwatch.watchdog.supervisor", "kvwatch.watchdog.supervisor.Supervisor"}


def test_the_checker_flags_submodules_but_not_lookalikes() -> None:
    assert set(forbidden_in({"http.server", "kvwatch.boundary.nvml", "os"})) == {"http.server",
                                                                                 "kvwatch.boundary.nvml", "os"}
    assert forbidden_in({"httpx_like", "kvwatch.boundaryless", "posixpath", "osmosis", "kvwatch.policy"}) == {}


def test_the_process_boundary_is_spawn_and_inspect() -> None:
    """kvwatch/boundary/processes.py was split: spawn.py starts and stops, proc_inspect.py reads."""
    assert not (PACKAGE / "boundary" / "processes.py").exists()
    assert not [rel(p) for p in all_files() if "kvwatch.boundary.processes" in imports_of(p)]


# -- The layers ------------------------------------------------------------------------------------
# pyproject.toml's [tool.importlinter] contract, checked with import-linter on grimp's graph of the
# source (an import inside a function counts, as above). A layer imports only the layers below it.

def layers_options() -> dict[str, Any]:
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c["type"] == "layers"]
    # as import-linter's own TOML reader hands them over: booleans as text
    return {key: str(value).lower() if isinstance(value, bool) else value for key, value in contract.items()}


def check_layers(graph: grimp.ImportGraph, options: dict[str, Any], root: str = "kvwatch") -> ContractCheck:
    contract = LayersContract(name=options["name"], session_options={"root_packages": [root]},
                              contract_options=options)
    return contract.check(graph, verbose=False)


def kvwatch_graph() -> grimp.ImportGraph:
    return grimp.build_graph("kvwatch", cache_dir=None)


def test_every_import_runs_down_the_layers() -> None:
    result = check_layers(kvwatch_graph(), layers_options())
    assert result.kept, result.metadata


def test_the_layers_name_the_order_the_architecture_page_draws() -> None:
    layers = [layer.replace(" ", "") for layer in layers_options()["layers"]]
    assert layers[:5] == ["cli", "commands", "exporter", "watchdog", "diagnosis|boundary|engine_status"]
    assert layers[5:7] == ["planner", "vllm_releases"]
    assert layers[7].split(":")[0] == "values"
    assert layers_options()["exhaustive"] == "true"   # a new top-level module must be given a layer


@pytest.mark.parametrize("importer,imported", [
    ("kvwatch.vllm_releases.defaults", "kvwatch.planner.plan"),        # release data -> planner
    ("kvwatch.values.versions", "kvwatch.vllm_releases"),             # shared types -> release data
    ("kvwatch.planner.plan", "kvwatch.diagnosis.diagnose"),            # planner -> diagnosis
    ("kvwatch.diagnosis.remedies", "kvwatch.boundary.nvml"),           # independent siblings
    ("kvwatch.watchdog.supervisor", "kvwatch.exporter.server"),        # watchdog -> exporter
    ("kvwatch.commands.plan", "kvwatch.cli"),
])
def test_an_arrow_back_up_breaks_the_contract(importer: str, imported: str) -> None:
    graph = kvwatch_graph()
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    assert not check_layers(graph, layers_options()).kept


def test_a_module_outside_every_layer_breaks_it() -> None:
    graph = kvwatch_graph()
    graph.add_module("kvwatch.unplaced")
    assert not check_layers(graph, layers_options()).kept


def test_a_deferred_import_back_up_in_a_module_on_disk_breaks_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The same contract text on a synthetic package: a function-level import is seen like a top one."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("from toy import low\n")
    (package / "low.py").write_text("def later():\n    from toy import high\n    return high\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    options = {"name": "toy layers", "type": "layers", "containers": ["toy"], "layers": ["high", "low"]}
    assert not check_layers(grimp.build_graph("toy", cache_dir=None), options, root="toy").kept
    (package / "low.py").write_text("def later():\n    return 1\n")
    assert check_layers(grimp.build_graph("toy", cache_dir=None), options, root="toy").kept


def test_no_import_circle_among_kvwatch_modules() -> None:
    graph = kvwatch_graph()
    cycles = [(m, n) for m in graph.modules for n in graph.find_modules_directly_imported_by(m)
              if graph.chain_exists(importer=n, imported=m)]
    assert not cycles
