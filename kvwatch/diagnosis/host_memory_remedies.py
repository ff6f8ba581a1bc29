"""Less host memory, for an engine the kernel's OOM killer ended (pure).

The first kill of a plan in a phase (starting, serving) is restarted as it is: another process may have
taken the memory, and a plan that served is not condemned by one kill. A repeat in the same phase takes
one change that lowers what vLLM itself keeps in host memory, each only where the release's parser has
the flag, in this order (the least harmful to serving first):
- `--kv-offloading-size` (KV blocks offloaded to CPU memory, GiB): halved, then 0;
- `--cpu-offload-gb` (weights kept in CPU memory, GiB): halved, then 0 (more of them on the GPU);
- `--max-parallel-loading-workers` 1, when several ranks load weights at once (TP x PP > 1).
`--swap-space` is not among them: the V1 engine (every release from 0.10's default) never swaps KV blocks
to host memory, so lowering it frees nothing. When nothing is left, the watchdog gives up and says it is
host memory and how much the host has.
"""
from __future__ import annotations

from collections.abc import Iterator

from kvwatch.diagnosis.facts import HostOomFacts
from kvwatch.errors import KvwatchError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange

_MIN_HALVED_GIB = 0.5          # below this, halving again frees too little: the flag goes to 0


def release_has(command: EngineCommand, flag: str) -> bool:
    """Whether the command's release parses `flag` as its own option (not as a prefix of another)."""
    option = command.options.by_name.get(flag)
    return option is not None


def _number(command: EngineCommand, flag: str) -> float | None:
    try:
        value = command.get(flag)
        return float(value) if value is not None else None
    except (KvwatchError, ValueError):
        return None


def _ranks(command: EngineCommand) -> int:
    try:
        settings = command.settings()
    except KvwatchError:
        return 1
    return max(1, settings.tensor_parallel_size) * max(1, settings.pipeline_parallel_size)


def _size(command: EngineCommand, flag: str) -> float | None:
    """A positive GiB size the command sets for `flag`, where its release has the flag."""
    size = _number(command, flag) if release_has(command, flag) else None
    return size if size is not None and size > 0 else None


def _halved(size: float) -> float:
    return round(size / 2, 2) if size / 2 >= _MIN_HALVED_GIB else 0


def host_memory_changes(command: EngineCommand) -> Iterator[tuple[FlagChange, str]]:
    """Each change that lowers vLLM's own host memory for this command, with why, in order of preference.
    (Each flag is spelled out: planner/flag_change.CHANGED_FLAGS is checked against the code's literals.)"""
    if (kv := _size(command, "--kv-offloading-size")) is not None:
        yield (FlagChange({"--kv-offloading-size": _halved(kv)}),
               f"--kv-offloading-size {kv:g} -> {_halved(kv):g} GiB of host memory")
    if (weights := _size(command, "--cpu-offload-gb")) is not None:
        yield (FlagChange({"--cpu-offload-gb": _halved(weights)}),
               f"--cpu-offload-gb {weights:g} -> {_halved(weights):g} GiB of host memory")
    if release_has(command, "--max-parallel-loading-workers") and _ranks(command) > 1:
        workers = _number(command, "--max-parallel-loading-workers")
        if workers is None or workers > 1:
            yield (FlagChange({"--max-parallel-loading-workers": 1}),
                   "one rank loads its weights at a time (the host's peak while loading)")


def host_oom_options(command: EngineCommand, facts: HostOomFacts) -> Iterator[tuple[FlagChange, str]]:
    """The remedies for a host OOM kill, as (change, reason): the same plan once per phase, then less memory."""
    phase = facts.phase or "starting"
    if facts.repeats == 0:
        yield NO_CHANGE, f"the kernel's OOM killer ended it once while {phase}: restart with the same plan"
        return
    for change, why in host_memory_changes(command):
        yield change, f"host memory ran out {facts.repeats + 1} times while {phase}: {why}"
