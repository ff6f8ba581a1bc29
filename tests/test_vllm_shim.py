"""deploy/container/vllm, the `vllm` a stack's pod runs when kvwatch is in the image: `vllm serve ...`
becomes `kvwatch run ... -- REAL_VLLM serve ...`, everything else (and everything inside an engine
kvwatch already supervises) goes to the real vLLM untouched. Here the shim runs under /bin/sh with a
real vLLM and a kvwatch that print what they were given; tests/test_fleet_engine_e2e.py runs it with
the real kvwatch and the real CPU engine."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvwatch.watchdog import leftovers

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "deploy" / "container" / "vllm"
PRINT_ARGV = '#!/bin/sh\nexec python3 -c \'import json, sys; print(json.dumps(["{who}", *sys.argv[1:]]))\' "$@"\n'


@pytest.fixture()
def bins(tmp_path: Path) -> dict[str, Path]:
    """PATH dirs: the shim's (first), the real vLLM's, and a fake kvwatch."""
    shim_dir, real_dir = tmp_path / "shim", tmp_path / "real"
    for d in (shim_dir, real_dir):
        d.mkdir()
    (shim_dir / "vllm").symlink_to(SHIM)
    (real_dir / "vllm").write_text(PRINT_ARGV.format(who="real-vllm"))
    (real_dir / "vllm").chmod(0o755)
    kvwatch = tmp_path / "kvwatch"
    kvwatch.write_text(PRINT_ARGV.format(who="kvwatch"))
    kvwatch.chmod(0o755)
    return {"shim": shim_dir, "real": real_dir, "kvwatch": kvwatch}


def shim(bins: dict[str, Path], *args: str, path: str | None = None, **env: str) -> tuple[int, list[str] | str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    environ.update({"PATH": path or f"{bins['shim']}:{bins['real']}:/usr/bin:/bin", "KVWATCH_BIN": str(bins["kvwatch"]),
                    **env})
    out = subprocess.run(["/bin/sh", "-c", 'exec vllm "$@"', "sh", *args], env=environ, capture_output=True,
                         text=True, timeout=30)
    return out.returncode, json.loads(out.stdout) if out.returncode == 0 else out.stderr


def test_serve_runs_under_kvwatch_with_the_command_unchanged(bins: dict[str, Path]) -> None:
    rc, argv = shim(bins, "serve", "/models/m", "--block-size", "8", "--chat-template", "a b")
    assert rc == 0
    assert argv == ["kvwatch", "run", "--", str(bins["real"] / "vllm"), "serve", "/models/m", "--block-size", "8",
                    "--chat-template", "a b"]


def test_config_and_flags_from_the_environment(bins: dict[str, Path]) -> None:
    rc, argv = shim(bins, "serve", "m", KVWATCH_CONFIG="/etc/kvwatch/kvwatch.toml",
                    KVWATCH_ARGS="--listen 0.0.0.0:9400   --learned-dir /models/*")
    assert argv == ["kvwatch", "run", "--config", "/etc/kvwatch/kvwatch.toml", "--listen", "0.0.0.0:9400",
                    "--learned-dir", "/models/*", "--", str(bins["real"] / "vllm"), "serve", "m"]


@pytest.mark.parametrize("args,env", [
    (("--version",), {}),
    (("bench", "latency"), {}),
    ((), {}),
    (("serve", "m"), {leftovers.MARKER_ENV: leftovers.marker("/var/lib/kvwatch", "vllm")}),   # inside an engine kvwatch runs
    (("serve", "m"), {"KVWATCH_DISABLE": "1"}),
], ids=["--version", "bench", "no args", "already supervised", "opted out"])
def test_everything_else_goes_to_the_real_vllm(bins: dict[str, Path], args: tuple[str, ...], env: dict) -> None:
    assert shim(bins, *args, **env) == (0, ["real-vllm", *args])


def test_the_guard_is_the_variable_kvwatch_sets_in_its_engines() -> None:
    assert f'"${{{leftovers.MARKER_ENV}:-}}"' in SHIM.read_text()


def test_the_shim_never_finds_itself(bins: dict[str, Path], tmp_path: Path) -> None:
    again = tmp_path / "again"
    again.mkdir()
    (again / "vllm").symlink_to(bins["shim"] / "vllm")   # the shim again, by another path
    path = f"{bins['shim']}:{again}:{bins['shim']}:{bins['real']}:/usr/bin:/bin"
    assert shim(bins, "--version", path=path) == (0, ["real-vllm", "--version"])
    assert shim(bins, "serve", "m", KVWATCH_REAL_VLLM=str(bins["real"] / "vllm"))[1][3] == str(bins["real"] / "vllm")


@pytest.mark.parametrize("env,message", [
    ({"PATH_ONLY_SHIM": "1"}, "no other vllm on PATH"),
    ({"KVWATCH_REAL_VLLM": "SELF"}, "KVWATCH_REAL_VLLM names this shim"),
])
def test_no_real_vllm_is_one_clear_error(bins: dict[str, Path], env: dict, message: str) -> None:
    path = f"{bins['shim']}:/usr/bin:/bin" if "PATH_ONLY_SHIM" in env else None
    extra = {"KVWATCH_REAL_VLLM": str(bins["shim"] / "vllm")} if "KVWATCH_REAL_VLLM" in env else {}
    rc, err = shim(bins, "serve", "m", path=path, **extra)
    assert rc == 2 and message in err and "Traceback" not in err
