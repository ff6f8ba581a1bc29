"""Where a stalled engine is stuck, from its threads' stacks (kvwatch/diagnosis/stall_stacks.py):
faulthandler's form (vLLM 0.33+'s own dump, --watchdog-config) and py-spy dump's, as a table."""
from __future__ import annotations

import pytest

from kvwatch.diagnosis.stall_stacks import (
    COMPILE,
    CUDA_SYNC,
    IDLE,
    MODEL_FORWARD,
    NCCL,
    SHM_BROADCAST,
    UNKNOWN,
    WEIGHT_LOAD,
    Frame,
    parse_stacks,
    where_stuck,
)

V = "/usr/local/lib/python3.12/dist-packages/vllm"
T = "/usr/local/lib/python3.12/dist-packages/torch"


def fh(thread: str, *frames: tuple[str, int, str], current: bool = False) -> str:
    """A thread as faulthandler writes it (vllm/utils/watch_dog.py dump_stack), innermost first."""
    head = f"{'Current thread' if current else 'Thread'} {thread} (most recent call first):"
    return "\n".join([head, *(f'  File "{f}", line {n} in {fn}' for f, n, fn in frames), ""])


def spy(tid: str, state: str, name: str, *frames: tuple[str, int, str]) -> str:
    """A thread as `py-spy dump --pid` prints it."""
    return "\n".join([f'Thread {tid} ({state}): "{name}"', *(f"    {fn} ({f}:{n})" for f, n, fn in frames)])


WATCHDOG_THREAD = fh("0x00007f3a9bfff640",
                     (f"{V}/utils/watch_dog.py", 89, "dump_stack"), (f"{V}/utils/watch_dog.py", 80, "handle_failure"),
                     (f"{V}/utils/watch_dog.py", 121, "_check_loop"), ("/usr/lib/python3.12/threading.py", 1010, "run"),
                     current=True)
WORKER_IN_NCCL = fh("0x00007f3b4e1c2740",
                    (f"{V}/distributed/device_communicators/pynccl.py", 295, "all_reduce"),
                    (f"{V}/distributed/device_communicators/cuda_communicator.py", 133, "all_reduce"),
                    (f"{V}/distributed/parallel_state.py", 745, "_all_reduce_out_place"),
                    (f"{V}/distributed/parallel_state.py", 203, "all_reduce"),
                    (f"{V}/model_executor/layers/linear.py", 1421, "forward"),
                    (f"{V}/model_executor/models/llama.py", 330, "forward"),
                    (f"{V}/v1/worker/gpu_model_runner.py", 3120, "execute_model"),
                    (f"{V}/v1/executor/multiproc_executor.py", 1172, "worker_busy_loop"))
WORKER_IDLE = fh("0x00007f3b4e1c2741",
                 (f"{V}/distributed/utils.py", 41, "sched_yield"),
                 (f"{V}/distributed/device_communicators/shm_broadcast.py", 895, "acquire_read"),
                 ("/usr/lib/python3.12/contextlib.py", 137, "__enter__"),
                 (f"{V}/distributed/device_communicators/shm_broadcast.py", 990, "dequeue"),
                 (f"{V}/v1/executor/multiproc_executor.py", 1160, "worker_busy_loop"))
CORE_WAITS_FOR_WORKERS = fh("0x00007f3c00001000",
                            (f"{V}/distributed/device_communicators/shm_broadcast.py", 897, "acquire_read"),
                            ("/usr/lib/python3.12/contextlib.py", 137, "__enter__"),
                            (f"{V}/distributed/device_communicators/shm_broadcast.py", 990, "dequeue"),
                            (f"{V}/v1/executor/multiproc_executor.py", 501, "get_response"),
                            (f"{V}/v1/executor/multiproc_executor.py", 520, "collective_rpc"),
                            (f"{V}/v1/engine/core.py", 420, "step"),
                            (f"{V}/v1/engine/core.py", 1640, "run_busy_loop"))
CORE_IDLE = fh("0x00007f3c00001000",
               ("/usr/lib/python3.12/threading.py", 359, "wait"), ("/usr/lib/python3.12/queue.py", 171, "get"),
               (f"{V}/v1/engine/core.py", 1663, "_process_input_queue"),
               (f"{V}/v1/engine/core.py", 1630, "run_busy_loop"))
SAMPLER_SYNC = fh("0x00007f3c00002000",
                  (f"{T}/cuda/__init__.py", 1215, "synchronize"),
                  (f"{V}/v1/worker/gpu_model_runner.py", 3300, "_sample"),
                  (f"{V}/v1/worker/gpu_model_runner.py", 3120, "execute_model"))
COMPILING = fh("0x00007f3c00003000",
               (f"{T}/_inductor/codecache.py", 2890, "load_by_key_path"),
               (f"{T}/_dynamo/eval_frame.py", 655, "_fn"),
               (f"{V}/compilation/backends.py", 700, "__call__"))
LOADING = fh("0x00007f3c00004000",
             ("/usr/local/lib/python3.12/dist-packages/safetensors/torch.py", 313, "load_file"),
             (f"{V}/model_executor/model_loader/weight_utils.py", 650, "safetensors_weights_iterator"),
             (f"{V}/model_executor/model_loader/default_loader.py", 290, "load_weights"))
FORWARD_ONLY = fh("0x00007f3c00005000",
                  (f"{V}/model_executor/layers/activation.py", 88, "forward_native"),
                  (f"{V}/model_executor/models/qwen2.py", 260, "forward"))
NOTHING_KNOWN = fh("0x00007f3c00006000", ("/srv/app/handler.py", 12, "spin"), ("/srv/app/main.py", 3, "<module>"))
SPY_NCCL = "\n".join([
    "Process 4242: VLLM::Worker_TP1",
    "Python v3.12.3 (/usr/bin/python3.12)",
    "",
    spy("4242", "active+gil", "MainThread",
        ("vllm/distributed/device_communicators/pynccl_wrapper.py", 402, "ncclAllReduce"),
        ("vllm/distributed/device_communicators/pynccl.py", 295, "all_reduce"),
        ("vllm/model_executor/models/llama.py", 330, "forward")),
    spy("4250", "idle", "Thread-1 (death_pipe_monitor)", ("multiprocessing/connection.py", 430, "_recv")),
])

# name, dumps (process, text), place, the frame's function, the words' start
ROWS = [
    ("a worker inside NCCL all_reduce, another idle, vLLM's watchdog thread",
     [("worker_1 pid 311", WATCHDOG_THREAD + WORKER_IN_NCCL), ("worker_0 pid 310", WORKER_IDLE)],
     NCCL, "all_reduce", "NCCL all_reduce"),
    ("the engine core waits for its workers in the shared-memory broadcast",
     [("engine_0 pid 300", CORE_WAITS_FOR_WORKERS), ("worker_0 pid 310", WORKER_IDLE)],
     SHM_BROADCAST, "acquire_read", "shared-memory broadcast (acquire_read)"),
    ("the NCCL worker wins over the core waiting for it",
     [("engine_0 pid 300", CORE_WAITS_FOR_WORKERS), ("worker_1 pid 311", WORKER_IN_NCCL)],
     NCCL, "all_reduce", "NCCL all_reduce"),
    ("a sampler waiting on CUDA", [("worker_0 pid 310", SAMPLER_SYNC + WORKER_IDLE)],
     CUDA_SYNC, "synchronize", "CUDA synchronize"),
    ("compiling", [("worker_0", COMPILING)], COMPILE, "load_by_key_path", "compiling"),
    ("loading weights", [("worker_0", LOADING)], WEIGHT_LOAD, "safetensors_weights_iterator", "loading weights"),
    ("in a layer's forward", [("worker_0", FORWARD_ONLY)], MODEL_FORWARD, "forward_native",
     "the model's forward pass"),
    ("an idle engine: nothing but waits for work", [("engine_0", CORE_IDLE), ("worker_0", WORKER_IDLE)],
     IDLE, "_process_input_queue", "idle"),
    ("nothing known: the main thread's innermost frame", [("app", NOTHING_KNOWN)], UNKNOWN, "spin", "no known place"),
    ("py-spy's form: the ctypes NCCL call", [("pid 4242", SPY_NCCL)], NCCL, "ncclAllReduce", "NCCL ncclAllReduce"),
    ("vLLM's numbered dumps appended in one file", [("engine_0", ">>> Call stack dump #1 at Sun Dec  6 due to "
                                                     "feed timeout\n\n" + CORE_IDLE + "\n" + "=" * 64 + "\n\n"
                                                     ">>> Call stack dump #2 due to SIGTERM\n\n" +
                                                     CORE_WAITS_FOR_WORKERS)],
     SHM_BROADCAST, "acquire_read", "shared-memory broadcast"),
]


@pytest.mark.parametrize("name,dumps,place,function,words", ROWS, ids=[r[0] for r in ROWS])
def test_where_the_engine_is_stuck(name: str, dumps: list[tuple[str, str]], place: str, function: str,
                                   words: str) -> None:
    stacks = [s for process, text in dumps for s in parse_stacks(text, process)]
    stuck = where_stuck(stacks)
    assert stuck is not None
    assert (stuck.place, stuck.frame.function) == (place, function)
    assert stuck.detail.startswith(words), stuck.detail
    assert stuck.process in {p for p, _ in dumps} and stuck.process in stuck.describe()


def test_no_stack_is_no_verdict() -> None:
    assert where_stuck([]) is None
    assert where_stuck(parse_stacks("Process 1: python\nPython v3.12\n\nno threads here\n")) is None


def test_both_forms_parse_to_the_same_frames() -> None:
    [worker] = parse_stacks(WORKER_IN_NCCL, "w")
    assert worker.frames[0] == Frame(f"{V}/distributed/device_communicators/pynccl.py", 295, "all_reduce")
    assert len(worker.frames) == 8 and worker.thread == "0x00007f3b4e1c2740"
    main, monitor = parse_stacks(SPY_NCCL, "p")
    assert (main.thread, monitor.thread) == ("MainThread", "Thread-1 (death_pipe_monitor)")
    assert main.frames[1] == Frame("vllm/distributed/device_communicators/pynccl.py", 295, "all_reduce")
    assert parse_stacks('Stack (most recent call first):\n  File "x.py", line ??? in f\n')[0].frames == (
        Frame("x.py", None, "f"),)
