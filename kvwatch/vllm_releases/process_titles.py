"""The titles vLLM gives its processes, to recognise an engine process kvwatch cannot prove its own.

vLLM renames its processes with `setproctitle` to PREFIX::NAME (APIServer, EngineCore, Worker, ...),
PREFIX from VLLM_PROCESS_NAME_PREFIX, "VLLM" by default (vLLM 0.32.0, vllm/utils/system_utils.py:194
and vllm/envs.py:1932; the same default since 0.11.2, vllm/envs.py:1369). setproctitle rewrites the
memory that holds argv and the environment, so /proc/PID/environ of such a process no longer shows
the variables it was started with: a title is a hint, never a proof.
"""
from __future__ import annotations

DEFAULT_PREFIX = "VLLM"
SEPARATOR = "::"


ENGINE_MODULES = ("vllm.entrypoints",)   # `python -m vllm.entrypoints.openai.api_server`, ...


def looks_like_vllm(name: str, cmdline: tuple[str, ...], prefix: str = DEFAULT_PREFIX) -> bool:
    """A process that calls itself a vLLM engine's: a PREFIX:: title (the kernel keeps 15 characters
    of it as the name), `vllm serve`, or python running vLLM's entry points (an API server before it
    renames itself)."""
    title = prefix + SEPARATOR
    if name.startswith(title[:15]) or any(arg.startswith(title) for arg in cmdline[:1]):
        return True
    words = [arg.rsplit("/", 1)[-1] for arg in cmdline[:4]]
    if "serve" in words and "vllm" in words[:2]:
        return True
    return any(arg.startswith(ENGINE_MODULES) for arg in cmdline[1:3])
