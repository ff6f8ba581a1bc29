"""Whether a serving engine makes progress, not only whether it answers (pure).

vLLM's /health asks whether the engine core is alive, not whether it advances: a wedged worker
(a kernel that never returns, a stopped process) leaves /health at 200, its running requests at
their count and its token counters still (vllm#39863, #37729). Progress is read from the engine's
own counters: a launch is stalled when requests run and neither the prompt nor the generated
token counter moves for the stall timeout.

What is never a stall: an idle engine (nothing runs), and work that has not reached a counter yet.
vLLM counts a request's prompt tokens when its first token comes out (vLLM 0.32,
vllm/v1/metrics/stats.py:519, IterationStats.update_from_output), so a long prefill or a slow
first token moves no counter; the timeout must be longer than the longest of them, and where the
engine computes on the CPU (vLLM's CPU backend), the CPU time of its processes is progress too.
"""
from __future__ import annotations

from dataclasses import dataclass

# A CPU backend that computes uses at least this share of one core; a stopped or wedged one ~0.
BUSY_CPU_SHARE = 0.05


@dataclass(frozen=True)
class Reading:
    """One look at the engine's counters (None: the engine did not report it)."""
    at: float                          # the injected clock's time of the reading
    running: float | None              # vllm:num_requests_running, summed over ranks
    prompt_tokens: float | None        # vllm:prompt_tokens_total, summed over ranks
    generation_tokens: float | None    # vllm:generation_tokens_total, summed over ranks
    cpu_seconds: float | None = None   # the engine's processes' CPU time, where it means compute


@dataclass(frozen=True)
class Watch:
    """What the detector remembers between readings."""
    last: Reading | None = None
    still_since: float | None = None   # requests ran and nothing moved since then; None: no window open


@dataclass(frozen=True)
class Stall:
    seconds: float
    evidence: str


def observe(watch: Watch, reading: Reading, timeout: float) -> tuple[Watch, Stall | None]:
    """The next state and, when the engine is stalled, the stall with the counters as evidence."""
    last = watch.last
    if reading.running is None or reading.prompt_tokens is None or reading.generation_tokens is None:
        return Watch(reading, None), None            # cannot judge: no window
    if reading.running <= 0:
        return Watch(reading, None), None            # idle
    if last is None or last.running is None or last.running <= 0 or _moved(last, reading):
        return Watch(reading, reading.at), None      # a window opens (or reopens) now
    still_since = watch.still_since if watch.still_since is not None else reading.at
    seconds = reading.at - still_since
    if timeout > 0 and seconds >= timeout:
        return Watch(reading, still_since), Stall(seconds, _evidence(reading, seconds))
    return Watch(reading, still_since), None


def _moved(before: Reading, now: Reading) -> bool:
    if (before.prompt_tokens, before.generation_tokens) != (now.prompt_tokens, now.generation_tokens):
        return True                                   # a counter moved (or the engine restarted them)
    if before.cpu_seconds is not None and now.cpu_seconds is not None and now.at > before.at:
        return (now.cpu_seconds - before.cpu_seconds) >= BUSY_CPU_SHARE * (now.at - before.at)
    return False


def _evidence(reading: Reading, seconds: float) -> str:
    return (f"{reading.running:g} requests running and no token for {seconds:.0f}s "
            f"(vllm:prompt_tokens_total {reading.prompt_tokens:g}, "
            f"vllm:generation_tokens_total {reading.generation_tokens:g}); /health still answers")
