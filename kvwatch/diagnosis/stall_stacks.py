"""Where a stalled engine is stuck, from its threads' Python stacks (pure).

The stacks come as text in either of two forms: faulthandler's, which vLLM 0.33+ writes itself
(`--watchdog-config '{"dump_dir": DIR}'`: DIR/VLLM_STACK_DUMP_for_{engine_N,worker_N}_{pid}.log, on
its own feed timeout and when the engine core gets SIGTERM; vllm/utils/watch_dog.py), and
`py-spy dump --pid`'s. Both list a thread's frames innermost first.

Each thread is matched against PLACES, most telling first: a thread inside an NCCL collective says
more than one waiting in the shared-memory broadcast for it, which says more than a model forward.
The verdict is the most telling place any thread is in; threads that only wait for work (a worker
in its busy loop, the engine core on its input queue) are idle, never the place.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    file: str
    line: int | None
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line if self.line is not None else '?'} in {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    process: str                  # what the caller named the dump (engine_0 pid 123, a pid, ...)
    thread: str                   # py-spy's name ("MainThread"), else faulthandler's id
    frames: tuple[Frame, ...]     # innermost first


@dataclass(frozen=True)
class StuckAt:
    place: str                    # one of PLACES' names, or UNKNOWN
    detail: str                   # in words: "NCCL all_reduce", "shared-memory broadcast (dequeue) ..."
    process: str
    thread: str
    frame: Frame                  # the frame that says so

    def describe(self) -> str:
        return f"{self.detail} ({self.process}, thread {self.thread}: {self.frame})"


NCCL = "nccl_collective"
CUDA_SYNC = "cuda_sync"
SHM_BROADCAST = "shm_broadcast"
COMPILE = "compile"
WEIGHT_LOAD = "weight_load"
MODEL_FORWARD = "model_forward"
IDLE = "idle"
UNKNOWN = "unknown"

_COLLECTIVES = frozenset({"all_reduce", "all_gather", "all_gatherv", "reduce_scatter", "reduce_scatterv",
                          "broadcast", "broadcast_object", "broadcast_object_list", "barrier", "send", "recv",
                          "all_to_all", "all_to_all_single", "gather", "scatter", "monitored_barrier",
                          "custom_all_reduce", "all_reduce_reg", "all_reduce_unreg"})
_COLLECTIVE_FILES = ("device_communicators/pynccl.py", "device_communicators/pynccl_wrapper.py",
                     "device_communicators/custom_all_reduce.py", "device_communicators/cuda_communicator.py",
                     "distributed/parallel_state.py", "torch/distributed/distributed_c10d.py",
                     "torch/distributed/c10d_logger.py")
_SHM_WAITS = frozenset({"acquire_read", "acquire_write", "dequeue", "enqueue", "wait_until_ready"})
# Where a thread waits for work, not for a peer: a worker's busy loop, the engine core's input queue.
_IDLE_CALLERS = frozenset({"worker_busy_loop", "_process_input_queue"})


def _in(file: str, *parts: str) -> bool:
    return any(part in file for part in parts)


def _nccl(f: Frame, _stack: Sequence[Frame]) -> str | None:
    if _in(f.file, *_COLLECTIVE_FILES) and (f.function in _COLLECTIVES or f.function.startswith("nccl")):
        return f"NCCL {f.function}: inside a collective (a rank that never joins it, or a link that broke)"
    return None


def _cuda_sync(f: Frame, _stack: Sequence[Frame]) -> str | None:
    if f.function == "synchronize" and _in(f.file, "torch/cuda/"):
        return ("CUDA synchronize: a kernel or an NCCL collective queued before it has not finished "
                "(a GPU hang, or a rank missing from a collective)")
    return None


def _shm(f: Frame, stack: Sequence[Frame]) -> str | None:
    if f.function not in _SHM_WAITS or not _in(f.file, "shm_broadcast.py"):
        return None
    if any(g.function in _IDLE_CALLERS for g in stack):
        return None   # a worker waiting for the next step: that is idle
    return (f"shared-memory broadcast ({f.function}): the engine core waits for a worker's answer "
            f"(a worker is stuck, or dead without its death seen)")


def _compile(f: Frame, _stack: Sequence[Frame]) -> str | None:
    if _in(f.file, "torch/_inductor/", "torch/_dynamo/", "triton/compiler/", "triton/runtime/"):
        return f"compiling ({f.function}): torch.compile or Triton, which can take minutes the first time"
    return None


def _weight_load(f: Frame, _stack: Sequence[Frame]) -> str | None:
    if _in(f.file, "model_executor/model_loader/"):
        return f"loading weights ({f.function})"
    return None


def _forward(f: Frame, _stack: Sequence[Frame]) -> str | None:
    if _in(f.file, "model_executor/models/", "model_executor/layers/", "v1/attention/", "attention/backends/"):
        return f"the model's forward pass ({f.function})"
    return None


def _idle(f: Frame, _stack: Sequence[Frame]) -> str | None:
    if f.function in _IDLE_CALLERS:
        return f"idle: waiting for work ({f.function})"
    return None


# (place, matcher): the most telling first. A matcher sees one frame and the thread's whole stack.
PLACES: tuple[tuple[str, Callable[[Frame, Sequence[Frame]], str | None]], ...] = (
    (NCCL, _nccl), (CUDA_SYNC, _cuda_sync), (SHM_BROADCAST, _shm), (COMPILE, _compile),
    (WEIGHT_LOAD, _weight_load), (MODEL_FORWARD, _forward), (IDLE, _idle),
)
_RANK = {place: i for i, (place, _) in enumerate(PLACES)}


def thread_place(stack: ThreadStack) -> tuple[str, str, Frame] | None:
    """The most telling place one thread is in, with its words and frame; None when none matches."""
    for place, match in PLACES:
        for frame in stack.frames:   # innermost first: the deepest frame that says so
            detail = match(frame, stack.frames)
            if detail is not None:
                return place, detail, frame
    return None


def where_stuck(stacks: Sequence[ThreadStack]) -> StuckAt | None:
    """The most telling place any thread is in (idle only when every matched thread is); UNKNOWN
    with the main thread's innermost frame when nothing matches; None without a stack."""
    found = [(thread_place(s), s) for s in stacks if s.frames]
    matched = [(p, s) for p, s in found if p is not None]
    if matched:
        (place, detail, frame), stack = min(matched, key=lambda m: _RANK[m[0][0]])
        return StuckAt(place, detail, stack.process, stack.thread, frame)
    if not found:
        return None
    stack = next((s for _, s in found if s.thread == "MainThread"), found[0][1])
    return StuckAt(UNKNOWN, "no known place: see the stacks", stack.process, stack.thread, stack.frames[0])


# -- reading the text -------------------------------------------------------------------

_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):")
_FH_STACK = re.compile(r"^Stack \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_SPY_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_SPY_FRAME = re.compile(r"^\s+(\S.*?) \((.*?)(?::(\d+))?\)\s*$")
MAX_FRAMES = 512   # per thread: a recursion's thousand frames say no more than its first


def parse_stacks(text: str, process: str = "") -> list[ThreadStack]:
    """Every thread's stack in a faulthandler or py-spy dump (both may be mixed, dumps appended);
    lines of neither form are skipped."""
    stacks: list[ThreadStack] = []
    thread: str | None = None
    frames: list[Frame] = []

    def close() -> None:
        if thread is not None:
            stacks.append(ThreadStack(process, thread, tuple(frames[:MAX_FRAMES])))

    for line in text.splitlines():
        head = _FH_THREAD.match(line) or _FH_STACK.match(line)
        spy = None if head else _SPY_THREAD.match(line)
        if head or spy:
            close()
            frames = []
            if head is not None and head.re is _FH_THREAD:
                thread = head.group(2) or head.group(1)
            elif head is not None:
                thread = "MainThread"
            else:
                assert spy is not None
                thread = spy.group(3) or spy.group(1)
            continue
        if thread is None:
            continue
        fh = _FH_FRAME.match(line)
        if fh is not None:
            number = fh.group(2)
            frames.append(Frame(fh.group(1), int(number) if number.isdigit() else None, fh.group(3).strip()))
            continue
        frame = _SPY_FRAME.match(line)
        if frame is not None:
            frames.append(Frame(frame.group(2), int(frame.group(3)) if frame.group(3) else None, frame.group(1)))
    close()
    return stacks
