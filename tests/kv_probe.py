"""Ask the real vLLM CPU engine what it decides for a model's KV cache.

`probe(config, flags, workdir)` writes a config-only model directory, starts
`python -m vllm.entrypoints.openai.api_server --model DIR --load-format dummy --skip-tokenizer-init
--enforce-eager --max-model-len 2048 [flags]` (HF_HUB_OFFLINE=1, VLLM_CPU_KVCACHE_SPACE=1, and
VLLM_LOGGING_LEVEL=DEBUG), reads its combined stdout/stderr while it runs, and stops the whole
process group as soon as it has the figures:

* `CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx`
  (EngineCore, v1/core/kv_cache_utils.py update_kv_cache_capacity): kv_cache_tokens,
  max_model_len, max_concurrency (vLLM 0.27 logs the two halves as two lines);
* `Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: N`
  (APIServer, DEBUG only, v1/metrics/loggers.py log_engine_initialized, about a second after the
  line above): num_blocks. vLLM 0.32 logs the block count nowhere else;
* block_size is logged nowhere as such (only indirectly: "kv cache group sizes", "Setting attention
  block size to N tokens", "CPU MLA backend requires block_size=16"), so the probe reads it from
  `vllm:cache_config_info` on /metrics, which the API server serves about a second after the
  num_gpu_blocks line; that read also cross-checks num_gpu_blocks. Only if /metrics does not
  answer in time does the probe fall back to the block size the log implies
  ("block_size_source" says which).

If the engine exits (or times out) before sizing, the result carries the error sentence ("error")
and "rc", the engine's exit status (None when the probe stopped it). "seconds" times the probe.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from engine_support import engine_argv, engine_env, free_port, http_get, kill_tree, write_model
from waiting import eventually

# One line from 0.28 on; two lines ("GPU KV cache size: N tokens", then "Maximum concurrency for ...")
# in 0.27 (vLLM 0.27.0, vllm/v1/core/kv_cache_utils.py:2235), so the two halves are read apart.
TOKENS_RE = re.compile(r"KV cache size: ([\d,]+) tokens")
CONCURRENCY_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
BLOCKS_RE = re.compile(r"num_gpu_blocks is: (\d+)")
INFO_RE = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.M)
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')

# Lines worth keeping verbatim: what vLLM decided about the KV cache, and why.
RELEVANT = re.compile("|".join([
    r"KV cache size:", r"Maximum concurrency for", r"num_gpu_blocks is", r"kv cache group sizes", r"kv lcm block sizes",
    r"Padding mamba page size", r"Setting attention block size", r"padding layers",
    r"Auto-fit max_model_len", r"Hybrid KV cache manager is disabled", r"cannot be unified",
    r"latency regression when using chunked local", r"CPU MLA backend requires",
    r"CPU backend prefers block_size", r"for KV cache on node", r"Using max model len",
    r"data type to store kv cache", r"Reset SSM cache type", r"estimated maximum model length",
    r"To serve at least one request", r"Using block size \d+ for", r"Overriding num_gpu_blocks",
    r"Mamba cache mode", r"Downcasting", r"[Ss]liding window", r"block_size", r"block size",
]))
# Known noise that matches RELEVANT or the error pattern but says nothing about the KV cache.
NOISE = re.compile(r"Tokenizer not available when `skip_tokenizer_init=True`|"
                   r"non-default args:|Initializing a V1 LLM engine|Registered kernel override|"
                   r"EmitCachedBlock|Chat template warmup failed")
ERROR_RE = re.compile(r"(?:^|\] |\) )((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): ?(.*)$")
GENERIC_ERRORS = re.compile(r"Engine core initialization failed|EngineDeadError|"
                            r"EngineCore encountered an issue|KeyboardInterrupt")
PREFIX_RE = re.compile(r"^\((?:APIServer|EngineCore|Worker|VllmWorker)[^)]*\) "
                       r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S+ \[[^\]]*\] ")


def _message(line: str) -> str:
    return PREFIX_RE.sub("", line)


def error_sentences(lines: list[str]) -> list[str]:
    """Every distinct `XxxError: message` the engine printed, in order, without the generic
    "Engine core initialization failed" wrapper and known noise; a pydantic ValidationError is
    followed by its "Value error, ..." (or field) lines, which are joined in. The last one is
    what stopped the engine (an EngineCore failure is logged before its API-server wrapper)."""
    found: list[str] = []
    for i, line in enumerate(lines):
        if NOISE.search(line) or " WARNING " in line:
            continue
        msg = _message(line).strip()
        m = ERROR_RE.search(msg)
        if not m or GENERIC_ERRORS.search(msg):
            continue
        kind, text = m.group(1), m.group(2).strip()
        if kind.endswith("ValidationError"):
            detail = []
            for follow in lines[i + 1:i + 6]:
                f = _message(follow).strip()
                if not f or f.startswith("For further information"):
                    break
                detail.append(f)
            text = (text + " " + " ".join(detail)).strip()
        sentence = f"{kind.rsplit('.', 1)[-1]}: {text}".strip()
        if sentence not in found:
            found.append(sentence)
    return found


def _metrics_info(url: str, deadline: float) -> dict | None:
    def info() -> dict | None:
        status, body = http_get(url + "/metrics", timeout=2)
        m = INFO_RE.search(body) if status == 200 else None
        return dict(LABEL_RE.findall(m.group(1))) if m else None
    return eventually(info, deadline - time.monotonic(), interval=0.5)


def _implied_block_size(flags: list[str], lines: list[str]) -> int | None:
    text = "\n".join(lines)
    if m := re.search(r"Setting attention block size to (\d+)", text):
        return int(m.group(1))
    if "CPU MLA backend requires block_size=16" in text:
        return 16
    if "--block-size" in flags:
        return int(flags[flags.index("--block-size") + 1])
    return None


def probe(config: dict, flags: list[str], workdir: Path, timeout: float = 240,
          metrics_wait: float = 30, python: str | None = None) -> dict:
    """Run the engine on `config` with `flags` until it has sized its KV cache; return the figures.

    `--max-model-len 2048` is added unless `flags` set --max-model-len themselves. `python` is the
    interpreter of another release's venv (tests/record_kv_truth.py --venv); default this one's."""
    workdir = Path(workdir)
    model = write_model(workdir / "model", config)
    log_path = workdir / "engine.log"
    extra = list(flags) if "--max-model-len" in flags else ["--max-model-len", "2048", *flags]
    port = free_port()
    argv = engine_argv(model, port, *extra, python=python)
    env = {**engine_env(1), "VLLM_LOGGING_LEVEL": "DEBUG"}
    if "--tensor-parallel-size" in flags:
        # vLLM's CPU workers bind one NUMA node each unless told which cores to take: a one-node
        # machine refuses TP 2 ("Not enough allowed NUMA nodes"), so give each rank its own core(s).
        tp = int(flags[flags.index("--tensor-parallel-size") + 1])
        cores = max(1, (os.cpu_count() or 1) // tp)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            str(r * cores) if cores == 1 else f"{r * cores}-{r * cores + cores - 1}" for r in range(tp))
    result: dict = {"num_blocks": None, "block_size": None, "kv_cache_tokens": None,
                    "max_concurrency": None, "max_model_len": None, "block_size_source": None,
                    "metrics": None, "log_lines": [], "rc": None, "error": None, "seconds": None,
                    "argv": ["MODEL" if a == str(model) else a for a in argv[3:]
                             if a not in ("--port", str(port), "--host", "127.0.0.1")]}
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    lines: list[str] = []
    pending = b""
    offset = 0

    def read_new() -> None:
        nonlocal pending, offset
        with open(log_path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        offset += len(chunk)
        data = pending + chunk
        *complete, pending = data.split(b"\n")
        lines.extend(c.decode(errors="replace").rstrip("\r") for c in complete)

    try:
        deadline = started + timeout
        sized_at = None
        scanned = 0
        while True:
            exited = proc.poll() is not None  # before the read, so the last lines are scanned
            read_new()
            for line in lines[scanned:]:
                if result["kv_cache_tokens"] is None and (m := TOKENS_RE.search(line)):
                    result["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
                    sized_at = sized_at or time.monotonic()
                if result["max_concurrency"] is None and (m := CONCURRENCY_RE.search(line)):
                    result["max_model_len"] = int(m.group(1).replace(",", ""))
                    result["max_concurrency"] = float(m.group(2))
                if result["num_blocks"] is None and (m := BLOCKS_RE.search(line)):
                    result["num_blocks"] = int(m.group(1))
            scanned = len(lines)
            if result["kv_cache_tokens"] is not None and result["max_concurrency"] is not None \
                    and result["num_blocks"] is not None:
                break
            if exited:
                result["rc"] = proc.returncode
                break
            now = time.monotonic()
            if now > deadline or (sized_at is not None and now > sized_at + metrics_wait):
                result["error"] = (f"timeout: no KV cache size line after {timeout:.0f} s"
                                   if sized_at is None else
                                   f"timeout: no num_gpu_blocks line {metrics_wait:.0f} s after sizing")
                break
            time.sleep(0.25)
        if result["num_blocks"] is not None and proc.poll() is None:
            info = _metrics_info(f"http://127.0.0.1:{port}", time.monotonic() + metrics_wait)
            if info:
                result["metrics"] = {k: info.get(k) for k in
                                     ("num_gpu_blocks", "block_size", "kv_cache_size_tokens",
                                      "kv_cache_max_concurrency", "cache_dtype",
                                      "mamba_block_size", "mamba_page_size_padded")}
                if info.get("block_size", "").isdigit():
                    result["block_size"] = int(info["block_size"])
                    result["block_size_source"] = "metrics"
    finally:
        kill_tree(proc)
        read_new()
        if pending:
            lines.append(pending.decode(errors="replace"))
    if result["block_size"] is None and result["num_blocks"] is not None:
        implied = _implied_block_size(list(flags), lines)
        if implied is not None:
            result["block_size"], result["block_size_source"] = implied, "log"
    result["log_lines"] = [line for line in lines
                           if RELEVANT.search(line) and not NOISE.search(line)]
    if result["kv_cache_tokens"] is None or (result["num_blocks"] is None and result["rc"] is not None):
        # Not sized, or sized and then dead before reporting its blocks (a crash after the sizing)
        errors = error_sentences(lines)
        result["errors"] = errors
        result["error"] = (errors[-1] if errors else None) or result["error"] or \
            f"engine exited with {result['rc']} before sizing its KV cache"
        err_lines = [line for line in lines if ERROR_RE.search(_message(line)) and not NOISE.search(line)
                     and " WARNING " not in line]
        result["log_lines"] += [line for line in err_lines[:6] if line not in result["log_lines"]]
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    from fixtures.models import corpus
    name, *flags = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(probe(corpus.config(name), flags, Path(tmp)), indent=1))
