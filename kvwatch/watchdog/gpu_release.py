"""Whether a dead engine's GPU memory is released, from what NVML shows (pure).

A relaunch onto a GPU the dead engine still holds gets a smaller KV pool or fails as
gpu_memory_busy, so before a relaunch kvwatch waits, bounded, until every GPU is clean. A GPU is
clean when NVML lists none of the engine's pids on it and, where its used memory before the launch
is known, its used memory is back within a slack of that. The second test is what tells when the
per-process list cannot: a driver that reports no processes, or a container whose pids are not the
ones NVML reports. Memory someone else took meanwhile also keeps a GPU "held": the relaunch would
find it short all the same, and the timeout bounds the wait.
"""
from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kvwatch.gpu_types import NvmlSnapshot

DEFAULT_SLACK_BYTES = 256 << 20   # what the driver's bookkeeping moves by; a CUDA context is ~500 MiB
DEFAULT_TIMEOUT_S = 30.0          # the driver frees a dead process's memory within seconds
DEFAULT_POLL_S = 0.5


class ReleaseOutcome(str, enum.Enum):
    WAIT = "wait"                # still held, time left
    RELEASED = "released"        # every GPU clean
    TIMED_OUT = "timed_out"      # still held at the timeout: relaunch anyway, and say so
    UNAVAILABLE = "unavailable"  # NVML cannot tell (no driver, an NVML error): nothing to wait on
    CANCELLED = "cancelled"      # kvwatch was asked to stop during the wait


@dataclass(frozen=True)
class GpuHold:
    """One GPU the dead engine may still hold."""

    uuid: str
    pids: tuple[int, ...] = ()            # the engine's pids NVML still lists on it
    pids_bytes: int | None = 0            # their memory (None: NVML does not report it)
    used_bytes: int | None = None         # the GPU's used memory now
    baseline_bytes: int | None = None     # its used memory before the launch (None: not known)
    seen: bool = True                     # False: NVML does not show this GPU now (lost, gone)

    def why_held(self, slack_bytes: int = DEFAULT_SLACK_BYTES) -> str | None:
        """Why this GPU is not clean yet; None when it is."""
        if not self.seen:
            return f"{self.uuid}: not seen by NVML"
        if self.pids:
            held = f" still hold {_gib(self.pids_bytes)}" if self.pids_bytes is not None else " still listed"
            return f"{self.uuid}: engine pid(s) {', '.join(map(str, self.pids))}{held}"
        if self.used_bytes is not None and self.baseline_bytes is not None \
                and self.used_bytes > self.baseline_bytes + slack_bytes:
            return f"{self.uuid}: {_gib(self.used_bytes)} used, {_gib(self.baseline_bytes)} before the launch"
        return None


@dataclass(frozen=True)
class ReleaseVerdict:
    outcome: ReleaseOutcome
    elapsed_s: float
    held: tuple[GpuHold, ...]   # the GPUs not clean yet
    text: str                   # for the log and the failure record


def baseline_of(snapshot: NvmlSnapshot, uuids: Collection[str] | None = None) -> dict[str, int | None]:
    """The used memory of the GPUs `uuids` (every GPU NVML shows when None), read before a launch."""
    return {g.uuid: g.memory_used_bytes for g in snapshot.gpus if uuids is None or g.uuid in uuids}


def gpu_holds(snapshot: NvmlSnapshot, engine_pids: Collection[int],
              baseline: Mapping[str, int | None]) -> tuple[GpuHold, ...]:
    """Every GPU that lists one of the engine's pids, and every GPU of `baseline`, as NVML shows them."""
    out: list[GpuHold] = []
    for gpu in snapshot.gpus:
        ours = sorted((p for p in gpu.processes or () if p.pid in engine_pids), key=lambda p: p.pid)
        if not ours and gpu.uuid not in baseline:
            continue
        sizes = [p.used_bytes for p in ours]
        pids_bytes = None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)
        out.append(GpuHold(gpu.uuid, tuple(p.pid for p in ours), pids_bytes, gpu.memory_used_bytes,
                           baseline.get(gpu.uuid)))
    shown = {gpu.uuid for gpu in snapshot.gpus}
    out += [GpuHold(uuid, seen=False, baseline_bytes=used) for uuid, used in baseline.items() if uuid not in shown]
    return tuple(out)


def release_verdict(holds: Collection[GpuHold], elapsed_s: float, timeout_s: float,
                    slack_bytes: int = DEFAULT_SLACK_BYTES) -> ReleaseVerdict:
    """Released when every GPU is clean, else wait until `timeout_s`, then timed out."""
    held = tuple(h for h in holds if h.why_held(slack_bytes) is not None)
    if not held:
        gpus = ", ".join(h.uuid for h in holds) or "no GPU"
        return ReleaseVerdict(ReleaseOutcome.RELEASED, elapsed_s, (),
                              f"GPU memory released ({gpus}) after {elapsed_s:.1f} s")
    reasons = "; ".join(h.why_held(slack_bytes) or "" for h in held)
    if elapsed_s >= timeout_s:
        return ReleaseVerdict(ReleaseOutcome.TIMED_OUT, elapsed_s, held,
                              f"GPU memory not released after {elapsed_s:.1f} s: {reasons}")
    return ReleaseVerdict(ReleaseOutcome.WAIT, elapsed_s, held, f"waiting for GPU memory: {reasons}")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"
