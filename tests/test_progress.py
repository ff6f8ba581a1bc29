"""The stall detector (kvwatch.watchdog.progress) as a table: readings in, a stall out or not."""
from __future__ import annotations

import pytest

from kvwatch.watchdog.progress import Reading, Watch, observe

TIMEOUT = 30.0


def run(readings: list[Reading]) -> list[int]:
    """The indexes of the readings at which a stall is reported."""
    watch, stalls = Watch(), []
    for i, reading in enumerate(readings):
        watch, stall = observe(watch, reading, TIMEOUT)
        if stall is not None:
            stalls.append(i)
    return stalls


def every(seconds: float, n: int, running: float = 1, prompt: float = 10, gen: float = 5,
          gen_step: float = 0, cpu: float | None = None, cpu_step: float = 0, start: float = 0) -> list[Reading]:
    return [Reading(start + i * seconds, running, prompt, gen + i * gen_step,
                    None if cpu is None else cpu + i * cpu_step) for i in range(n)]


@pytest.mark.parametrize("name,readings,stalls", [
    ("a wedged worker: a request runs, no counter moves", every(5, 8), [6, 7]),
    ("idle: nothing runs, nothing moves", every(5, 20, running=0), []),
    ("a long generation: tokens keep coming", every(5, 20, gen_step=3), []),
    ("the engine reports no counters", [Reading(i * 5.0, None, None, None) for i in range(20)], []),
    ("a long prefill on the CPU backend: its CPU time moves", every(5, 20, cpu=100, cpu_step=4), []),
    ("a stopped CPU engine: its CPU time is still", every(5, 8, cpu=100, cpu_step=0.01), [6, 7]),
    ("the window starts when requests start running",
     every(5, 10, running=0) + every(5, 8, start=50), [16, 17]),
    ("progress resets the window",
     every(5, 5) + every(5, 1, gen=6, start=25) + every(5, 7, gen=6, start=30), [11, 12]),
    ("a restarted engine's counters start again: that is no stall",
     every(5, 5, gen=500) + every(5, 5, gen=0, start=25), []),
])
def test_stalls(name: str, readings: list[Reading], stalls: list[int]) -> None:
    assert run(readings) == stalls, name


def test_a_stall_names_the_counters_and_its_length() -> None:
    watch, stall = Watch(), None
    for reading in every(10, 5, running=2, prompt=123, gen=45):
        watch, stall = observe(watch, reading, TIMEOUT)
    assert stall is not None and stall.seconds == 40
    assert stall.evidence == ("2 requests running and no token for 40s (vllm:prompt_tokens_total 123, "
                              "vllm:generation_tokens_total 45); /health still answers")


def test_a_timeout_of_zero_turns_the_detector_off() -> None:
    watch = Watch()
    for reading in every(5, 50):
        watch, stall = observe(watch, reading, 0.0)
        assert stall is None
