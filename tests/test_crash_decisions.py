"""A crash is a restart, never a verdict (issue 42): the decision after a launch ends, as tables over
signal x phase x evidence x budget, and host OOM kills repeated in one phase. Pure: no process, no clock."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kvwatch.diagnosis import FailureKind
from kvwatch.diagnosis.start_phase import CAPTURING, LOADING, PROFILING, SERVING, STARTING, phase_of
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.watchdog import recovery
from kvwatch.watchdog.outcomes import NO_KERNEL_RECORD, KernelRecord, LaunchOutcome, signal_of
from kvwatch.watchdog.records import FailureRecord
from kvwatch.watchdog.recovery import Action, BudgetState

SERVE = ("vllm", "serve", "m")
LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
K = FailureKind

# Phases, as the engine's own progress lines show them.
PHASE_LINES = {
    STARTING: ["(APIServer pid=8) INFO 12-05 10:00:00 [utils.py:253] non-default args: {'model': 'm'}"],
    LOADING: ["(EngineCore pid=9) INFO 12-05 10:00:01 [gpu_model_runner.py:2000] Starting to load model m..."],
    PROFILING: ["(EngineCore pid=9) INFO 12-05 10:00:05 [default_loader.py:484] Loading weights took 0.87 seconds"],
    CAPTURING: ["(EngineCore pid=9) INFO 12-05 10:00:09 [gpu_model_runner.py:3000] Capturing CUDA graphs (mixed "
                "prefill-decode, PIECEWISE): 100%"],
    SERVING: ["(APIServer pid=8) INFO 12-05 10:00:12 [api_server.py:1500] Starting vLLM API server 0 on "
              "http://0.0.0.0:8000"],
}
# Evidence: none; a benign WARNING quoting an exception (never evidence); a root cause in an ERROR record.
WARNING = ["(APIServer pid=8) WARNING 12-05 10:00:13 [serving_chat.py:120] Chat template could not be loaded: "
           "ValueError: Tokenizer not available when skip_tokenizer_init=True"]
ROOT_CAUSE = (LOGS / "cpu_block_size_8.log").read_text().splitlines()
EVIDENCE = {"none": [], "warning": WARNING, "root_cause": ROOT_CAUSE}
SIGNALS = {"exit 1": 1, "exit 0": 0, "SIGKILL": -9, "SIGTERM": -15, "SIGINT": -2}
BUDGETS = {"room": BudgetState(), "full": BudgetState(restart_refused="3 restarts within 600s (policy.max_restarts)")}
OOM = KernelRecord(oom_kills=1, where="cgroup /system.slice/vllm.service: oom_kill 0 -> 1",
                   host_memory_bytes=24 * 2**30, host_memory="24.0 GiB, cgroup limit none")


def end(signal: str, phase: str, evidence: str, kernel: KernelRecord = NO_KERNEL_RECORD,
        earlier: tuple[FailureRecord, ...] = (), argv: tuple[str, ...] = SERVE):
    code = SIGNALS[signal]
    lines = PHASE_LINES[phase] + EVIDENCE[evidence]
    return recovery.diagnosis_of(LaunchOutcome.EXIT, f"exited with code {code}", lines, served=False,
                                 returncode=code, kernel=kernel, earlier=earlier, argv=argv, now=1000.0,
                                 signal_name=signal if code < 0 else "")


# (signal, phase, evidence, kernel OOM?) -> the class named, and words its evidence holds
TABLE = [
    ("SIGKILL", LOADING, "none", False, K.KILLED, "killed by signal 9 (SIGKILL) from outside while loading weights"),
    ("SIGKILL", SERVING, "warning", False, K.KILLED, "signal 9 (SIGKILL) from outside while serving"),
    ("SIGTERM", PROFILING, "none", False, K.KILLED, "signal 15 (SIGTERM) from outside while profiling memory"),
    ("SIGINT", CAPTURING, "none", False, K.KILLED, "signal 2 (SIGINT)"),
    ("SIGKILL", LOADING, "none", True, K.HOST_OOM, "the kernel's OOM killer ended the engine while loading weights"),
    ("exit 1", PROFILING, "none", True, K.HOST_OOM, "host memory: 24.0 GiB"),
    # a root cause in an ERROR record wins over the signal (vLLM's API server SIGKILLs itself after one)
    ("SIGKILL", STARTING, "root_cause", False, K.BLOCK_SIZE_UNSUPPORTED, "block size"),
    ("SIGKILL", STARTING, "root_cause", True, K.BLOCK_SIZE_UNSUPPORTED, "block size"),
    ("exit 1", LOADING, "none", False, K.UNKNOWN, None),
    ("exit 0", LOADING, "warning", False, K.UNKNOWN, None),
    # the engine's own READY line counts as kvwatch's probe: the same verdict either side of the race
    ("exit 1", SERVING, "warning", False, K.ENGINE_DIED, None),
]


@pytest.mark.parametrize("signal,phase,evidence,oom,kind,words", TABLE,
                         ids=[f"{r[0]}-{r[1]}-{r[2]}-{'oom' if r[3] else 'no-oom'}" for r in TABLE])
def test_what_ended_the_launch_is_named(signal, phase, evidence, oom, kind, words):
    d = end(signal, phase, evidence, OOM if oom else NO_KERNEL_RECORD)
    assert d.kind is kind, (d.kind, d.evidence)
    assert not d.fatal
    if words is not None:
        assert d.evidence is not None and words.lower() in d.evidence.lower(), d.evidence
    assert "Tokenizer not available" not in (d.evidence or "")   # a WARNING is never evidence


@pytest.mark.parametrize("signal,phase,evidence,budget", list(itertools.product(SIGNALS, PHASE_LINES,
                                                                                ("none", "warning"), BUDGETS)))
def test_a_crash_with_no_cause_is_restarted_within_the_budget(signal, phase, evidence, budget):
    """Signal x phase x evidence x budget: no failure line names a cause, so the plan is restarted as it is while
    the budget has room, and given up only when it is full, saying what kvwatch saw."""
    d = end(signal, phase, evidence)
    decision = recovery.decide(d, EngineCommand(SERVE), budget=BUDGETS[budget])
    if budget == "room":
        assert decision.action is Action.RESTART and decision.command is not None
        assert decision.command.argv == SERVE
    else:
        assert decision.action is Action.GIVE_UP and "policy.max_restarts" in decision.reason
        # a WARNING may be quoted as the engine's last line, never as the evidence
        assert "Tokenizer not available" not in decision.reason.split("; the engine's last line")[0]
        if d.kind is K.UNKNOWN:   # it says what it saw: the phase and the engine's last line
            assert f"while {phase}" in decision.reason and "the engine's last line" in decision.reason


@pytest.mark.parametrize("signal", SIGNALS)
def test_a_named_root_cause_is_corrected_whatever_the_signal(signal):
    d = end(signal, STARTING, "root_cause")
    decision = recovery.decide(d, EngineCommand(SERVE + ("--block-size", "8")))
    assert decision.action is Action.CORRECT and d.kind is K.BLOCK_SIZE_UNSUPPORTED


def test_a_kill_does_not_condemn_its_plan():
    failures = [FailureRecord(K.KILLED, "e", 0.0, list(SERVE)), FailureRecord(K.UNKNOWN, "e", 1.0, list(SERVE)),
                FailureRecord(K.HOST_OOM, "e", 2.0, list(SERVE))]
    assert recovery.tried_plans(failures) == set()


# -- host OOM kills repeated in one phase ---------------------------------------------------------------

OFFLOAD = SERVE + ("--tensor-parallel-size", "2", "--kv-offloading-size", "8", "--cpu-offload-gb", "4")


def oom_history(argv: tuple[str, ...], phase: str, count: int, at: float = 900.0) -> tuple[FailureRecord, ...]:
    return tuple(FailureRecord(K.HOST_OOM, "oom", at, list(argv), "exited with code -9", phase) for _ in range(count))


@pytest.mark.parametrize("argv,earlier,action,changed", [
    (OFFLOAD, (), Action.RESTART, {}),                                             # once: the same plan
    (OFFLOAD, oom_history(OFFLOAD, LOADING, 1), Action.CORRECT, {"--kv-offloading-size": 4.0}),
    (OFFLOAD, oom_history(OFFLOAD, PROFILING, 1), Action.RESTART, {}),             # another phase: no pattern
    (OFFLOAD, oom_history(OFFLOAD, LOADING, 1, at=-5000.0), Action.RESTART, {}),   # over an hour ago
    (SERVE + ("--cpu-offload-gb", "0.6"), oom_history(SERVE + ("--cpu-offload-gb", "0.6"), LOADING, 2),
     Action.CORRECT, {"--cpu-offload-gb": 0}),
    (SERVE + ("-tp", "4"), oom_history(SERVE + ("-tp", "4"), LOADING, 1), Action.CORRECT,
     {"--max-parallel-loading-workers": 1}),
])
def test_repeated_host_oom_lowers_host_memory(argv, earlier, action, changed):
    d = end("SIGKILL", LOADING, "none", OOM, earlier=earlier, argv=argv)
    assert d.kind is K.HOST_OOM
    decision = recovery.decide(d, EngineCommand(argv))
    assert decision.action is action, decision
    assert dict(decision.change.set) == changed


def test_repeated_host_oom_with_nothing_left_gives_up_naming_host_memory():
    earlier = oom_history(SERVE, LOADING, 1)
    d = end("SIGKILL", LOADING, "none", OOM, earlier=earlier)
    decision = recovery.decide(d, EngineCommand(SERVE))
    assert decision.action is Action.GIVE_UP
    assert "host_oom" in decision.reason and "host memory: 24.0 GiB" in decision.reason


@pytest.mark.parametrize("lines,phase", [
    ([], STARTING),
    (PHASE_LINES[LOADING], LOADING),
    (PHASE_LINES[LOADING] + PHASE_LINES[PROFILING], PROFILING),
    (PHASE_LINES[PROFILING] + PHASE_LINES[CAPTURING], CAPTURING),
    (PHASE_LINES[CAPTURING] + PHASE_LINES[SERVING] + WARNING, SERVING),
])
def test_the_phase_is_the_last_progress_line(lines, phase):
    assert phase_of(lines) == phase


@pytest.mark.parametrize("returncode,signal", [(-9, 9), (-15, 15), (137, 9), (143, 15), (0, None), (1, None),
                                               (78, None), (128, None), (255, None), (None, None)])
def test_the_signal_that_ended_a_launch(returncode, signal):
    """-N from Popen, 128+N from a shell, a container runtime or the vllm shim: the same kill."""
    assert signal_of(returncode) == signal


def test_a_shim_reporting_sigkill_as_137_is_a_kill_too():
    d = recovery.diagnosis_of(LaunchOutcome.EXIT, "exited with code 137", PHASE_LINES[LOADING], served=False,
                              returncode=137, signal_name="SIGKILL")
    assert d.kind is K.KILLED and d.evidence == "killed by signal 9 (SIGKILL) from outside while loading weights"
