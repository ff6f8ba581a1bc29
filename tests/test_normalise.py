"""Logs as they arrive (kvwatch/diagnosis/normalise.py): the prefixes of the tools that run vLLM, lines a
terminal wrapped, a log pasted as one line; and the root-cause rule still holds behind them."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.diagnosis import FailureKind, LogScanner, diagnose
from kvwatch.diagnosis.normalise import WORDS, normalise, split_pasted
from kvwatch.diagnosis.prefixes import SHAPES, common_prefixes, signature
from kvwatch.diagnosis.rejoin import continues, reflowed, separator

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
ROOT_CAUSE = ("(EngineCore_DP0 pid=7) ERROR 06-09 14:01:52 [core.py:1136] ValueError: No available memory for the "
              "cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")
# Prefixes as public logs show them: what runs vLLM (or pastes it) puts before each of its lines.
# Each is found by its shape (prefixes.SHAPES), none by the product's name.
SAMPLES = {
    "kubectl logs --prefix": "[pod/vllm-0/vllm] ",
    "docker logs -t": "2024-06-28T06:11:52.685300953Z ",
    "a launcher's record": "2026-06-09 14:01:52.982 [Error] (Process) ",
    "Python logging": "2025-08-13 04:39:39,838 - __main__ - INFO - ",
    "TorchServe": "2024-11-18T16:43:45,496 [INFO ] W-9000-model_1.0-stdout MODEL_LOG - ",
    "journald": "Jun 09 14:01:52 gpu-host-3 vllm.service[4242]: ",
    "journald, short day": "Dec  5 14:01:52 host vllm[123]: ",
    "docker compose": "vllm-1  | ",
    "Buildkite": "  | ",
    "a Markdown quote over Buildkite": ">   | ",
    "a Markdown quote": "> ",
    "a bracketed time": "[2025-12-05 14:01:52] ",
    "kubectl over docker -t": "[pod/vllm-0/vllm] 2024-06-28T06:11:52.685Z ",
    "syslog with ISO time": "2025-12-05T14:01:52+0000 host vllm[123]: ",
    # a 2026 harness logging a container's output (vllm-project/vllm#43410), and Ascend's CI logger (vllm-ascend#8480)
    "a harness's logging of a container": "2026-05-29 09:14:45,594 - INFO - [container] ",
    "Ascend's logger": "[2026-04-20 10:56:24.658054][UC][E] ",
}


def test_every_shape_is_named_with_an_example_that_has_it():
    assert all(shape.example and signature(shape.example + "x")[:1] == (shape.name,) or shape.after_timestamp
               for shape in SHAPES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_prefix_is_taken_off_every_line(name):
    log = [SAMPLES[name] + line for line in ["(APIServer pid=1) INFO 06-09 14:01:50 [api_server.py:1] vLLM API "
                                             "server version 0.20.2", ROOT_CAUSE, "Process EngineCore_DP0:"]]
    assert common_prefixes(log)
    assert normalise("\n".join(log)).splitlines()[1] == ROOT_CAUSE
    d = diagnose(log)
    assert d.kind is FailureKind.NO_KV_CACHE_MEMORY and d.evidence == ROOT_CAUSE
    assert d.facts["process"] == "EngineCore_DP0"


def test_vllms_own_heads_are_never_a_prefix():
    heads = ["(EngineCore_DP0 pid=7) ERROR 06-09 14:01:52 [core.py:1136] x", "INFO 06-09 14:01:52 [a.py:1] y",
             "(RayWorkerWrapper pid=2931, ip=10.0.0.2) INFO 06-09 [a.py:1] z", "Traceback (most recent call last):",
             "ValueError: x", "INFO:     127.0.0.1:53386 - \"GET /health HTTP/1.1\" 200 OK"]
    assert not common_prefixes(heads)
    assert normalise("\n".join(heads)).splitlines() == heads


def test_nims_logger_is_read_as_vllms_records():
    # NVIDIA NIM's logger: V0's head with hundredths of a second (the WARNING as canonical/bundle-kubeflow#1077
    # shows it, the ERROR in the same head)
    nim = ["WARNING 10-15 12:41:23.21 caches.py:27] /mnt/models/cache is read-only, application may fail if model is "
           "not already present in cache",
           "ERROR 10-15 12:41:30.5 worker.py:466] ValueError: No available memory for the cache blocks. Try increasing "
           "`gpu_memory_utilization` when initializing the engine."]
    assert normalise("\n".join(nim)).splitlines() == nim
    d = diagnose(nim)
    assert d.kind is FailureKind.NO_KV_CACHE_MEMORY and d.evidence == nim[1]


def test_kubectl_prefix_with_timestamps_comes_off_in_two_steps():
    line = "[pod/vllm-0/vllm] 2024-06-28T06:11:52.685Z " + ROOT_CAUSE
    assert normalise(line) == ROOT_CAUSE


def test_a_plain_vllm_log_is_left_as_it_is():
    text = (LOGS / "cpu_block_size_8.log").read_text()
    assert normalise(text) == text


def test_a_prefix_on_one_line_in_many_is_left_alone():
    lines = [f"INFO 01-01 00:00:{i:02d} [x.py:1] line {i}" for i in range(40)] + ["vllm-1  | not a prefix here"]
    assert normalise("\n".join(lines)).endswith("vllm-1  | not a prefix here")


def test_lines_a_terminal_wrapped_are_joined():
    records = [ROOT_CAUSE.replace("pid=7", f"pid={7 + i}") for i in range(6)]   # a log's records differ
    text = "\n".join(records)
    wrapped = "\n".join(text[i:i + 80] for line in text.splitlines() for i in range(0, len(line), 80)
                        for text in [line])
    assert normalise(wrapped).splitlines() == records
    d = diagnose(wrapped.splitlines())
    assert d.kind is FailureKind.NO_KV_CACHE_MEMORY and d.evidence in records


# Where a line continues the one before, and what stood between them: tables of real breaks.
@pytest.mark.parametrize("previous, line, joined", [
    ("ValueError: To serve at least one request with the model's max seq len (1048576),", "(8.00 GiB KV cache", True),
    ("Free memory on device cuda:0 (30.12/31.84 GiB) on startup is", "less than desired GPU", True),
    ("torch.OutOfMemoryError: CUDA out of", "memory. Tried to allocate", True),
    ("raise ValueError(", "    'x')", False),                               # indented code
    ("ValueError: No available memory for the cache blocks.", "Process EngineCore_DP0:", False),
    ("Available KV cache memory: 8.11 GiB", "GPU KV cache size: 178,880 tokens", False),   # a new message
    ("Loading weights took 1.2 seconds", "Memory profiling results: x", False),
    ('  File "/x/vllm/config.py", line 1, in f', "x", False),
    ("pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig", "gpu_memory_utilization",
     False),
    ("x" * 80, "(EngineCore_DP0 pid=7) ERROR 06-09 14:01:52 [core.py:1] next", False),
    ("x" * 80, "[W1130 01:49:36.380287484 utils.cpp:68] Warning: NUMA", False),
])
def test_which_line_continues_the_one_before(previous, line, joined):
    assert continues(previous, line) is joined


@pytest.mark.parametrize("previous, line, between", [
    ("the available KV cach", "e memory", ""),            # a word of vLLM's, split
    ("max seq len (10485", "76)", ""),                    # a number
    ("on device cuda:", "0 (30.12", ""),
    ("Free memory on device cuda:0 (30.", "12/31.84 GiB)", ""),
    ("larger than the", "available KV cache", " "),       # two words, as a page reflows them
    ("KV cache is ", "needed", ""),                        # the space kept by the terminal
    ("the model", "'s max seq len", ""),
    ("--max-", "model-len", ""),
])
def test_what_stood_between_the_halves(previous, line, between):
    assert separator(previous, line, WORDS) == between


def test_a_repeated_access_log_line_is_not_taken_for_a_terminal_width():
    # found by test_diagnosis's property test in CI: four copies of one access-log line made a "width",
    # and the refusal after one of them was joined onto that INFO line, so it was read as quiet
    access = 'INFO:     127.0.0.1:53386 - "POST /v1/completions HTTP/1.1" 200 OK'
    refusal = ["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
               "  Value error, User-specified max_model_len (300000) is greater than the derived max_model_len "
               "(max_position_embeddings=1024.0 or model_max_length=None in model's config.json). "
               "[type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]"]
    lines = [access, access, *refusal, access, access]
    assert normalise("\n".join(lines)).splitlines() == lines
    assert diagnose(lines).kind is FailureKind.CONFIG_REFUSED


def test_a_repeated_traceback_frame_is_not_taken_for_a_terminal_width():
    # found by test_diagnosis's property test: four frame lines of one length made a "width" of
    # them, and the root cause after one of them was joined onto it
    frame = '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/concurrent/futures/_base.py", line 401, in __get_result'
    root = ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 102400, "
            "Hardware limit: 101376. Reducing block sizes or `num_stages` may help.")
    lines = [frame, frame, root, frame, frame]
    assert normalise("\n".join(lines)).splitlines() == lines
    assert diagnose(lines).kind is FailureKind.KERNEL_OUT_OF_RESOURCES


def test_a_wrapped_line_never_swallows_the_next_record():
    full = "x" * 80
    lines = [full] * 6 + ["(EngineCore_DP0 pid=7) ERROR 06-09 14:01:52 [core.py:1] next record"]
    assert normalise("\n".join(lines)).splitlines()[-1] == lines[-1]


def test_a_log_pasted_as_one_line_is_cut_at_its_records():
    pasted = (" ".join(["(EngineCore_DP0 pid=7) ERROR 06-09 14:01:52 [core.py:1136]   File \"x.py\", line 1, in f"] * 6)
              + " " + ROOT_CAUSE + " (EngineCore_DP0 pid=7) Process EngineCore_DP0:")
    parts = split_pasted(pasted)
    assert ROOT_CAUSE in parts
    d = diagnose([pasted])
    assert d.kind is FailureKind.NO_KV_CACHE_MEMORY and d.evidence == ROOT_CAUSE


def test_the_root_cause_rule_holds_behind_a_prefix():
    # The API server quotes a model's output at ERROR (a parser error) before an engine core fails on its own:
    # only the engine's record names the failure, prefix or not (diagnose.py's process rule).
    quoted = ("(APIServer pid=1) ERROR 06-09 14:01:51 [serving_chat.py:1] Error in tool parser: CUDA out of memory. "
              "Tried to allocate 2.00 GiB")
    log = ["vllm-1  | " + line for line in (quoted, ROOT_CAUSE)]
    d = diagnose(log)
    assert d.kind is FailureKind.NO_KV_CACHE_MEMORY and d.facts["process"] == "EngineCore_DP0"


def test_the_scanner_fed_line_by_line_agrees_behind_a_prefix():
    scanner = LogScanner()
    for line in ("vllm-1  | " + ROOT_CAUSE, "vllm-1  | Process EngineCore_DP0:"):
        scanner.feed(line)
    assert scanner.result().evidence == ROOT_CAUSE


def test_a_log_cut_off_after_a_negative_kv_figure():
    log = ["(EngineCore_DP0 pid=7) INFO 06-09 14:01:50 [gpu_worker.py:298] Available KV cache memory: -2.14 GiB",
           "(EngineCore_DP0 pid=7) ERROR 06-09 14:01:50 [core.py:708] EngineCore failed to start."]
    d = diagnose(log)
    assert d.kind is FailureKind.NO_KV_CACHE_MEMORY and d.facts["available_kv_gib"] == -2.14
    assert "Available KV cache memory: -2.14 GiB" in (d.evidence or "")
    assert diagnose(log[1:]).kind is FailureKind.UNKNOWN          # without the figure nothing names it


def test_a_pasted_refusal_line_alone():
    d = diagnose(["Value error, Total number of attention heads (64) must be divisible by tensor parallel size (3)."])
    assert d.kind is FailureKind.CONFIG_REFUSED and d.fatal
    assert d.facts["num_attention_heads"] == 64 and d.facts["tensor_parallel_size"] == 3


def test_a_selector_reflowed_one_field_per_line_and_cut_before_its_reasons():
    # the shape: vLLM's selector sentence pretty-printed one field per line, the paste cut before "Reasons:"
    log = ["(EngineCore_DP0 pid=7) ERROR 01-20 13:03:50 [core.py:1] ValueError: No valid attention backend found "
           "for cuda with AttentionSelectorConfig(",
           "    head_size=576,", "    dtype=torch.bfloat16,", "    kv_cache_dtype=auto,", "    block_size=16,",
           "    use_mla=True,"]
    d = diagnose(log)
    assert d.kind is FailureKind.NO_ATTENTION_BACKEND and not d.fatal and d.facts["reasons_cut"]
    assert d.facts["selector_config"] == {"head_size": 576, "dtype": "torch.bfloat16", "kv_cache_dtype": "auto",
                                          "block_size": 16, "use_mla": True}


@pytest.mark.parametrize("previous, line, joined", [
    ("AttentionSelectorConfig(", "    head_size=576,", True),
    ("    head_size=576,", "    dtype=torch.bfloat16,", True),
    ("    raise ValueError(", "        f'No common block size for {x}'", False),     # code a traceback echoes
    ('  File "/x/vllm/config.py", line 1, in f', "    foo(", False),
    ("Traceback (most recent call last):", "  File \"x.py\", line 1, in f", False),
    ("engine_core = EngineCoreProc(", "                    ^^^^^^^^^^^^", False),      # a traceback's carets
])
def test_which_indented_line_is_a_reflowed_argument(previous, line, joined):
    assert reflowed(previous, line) is joined


@pytest.mark.parametrize("lines", [
    ["  Value error, Total number of attention heads (12) must be divisible by",
     "tensor parallel size (8). [type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]"],
    ["  Value error,",
     "Total number of attention heads (12) must be divisible by tensor parallel size (8). [type=value_error, "
     "input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]"],
    ["Total number of attention heads (12) must be divisible by tensor parallel size (8)"],   # the sentence alone
])
def test_a_reflowed_pydantic_refusal_keeps_its_refusal(lines):
    d = diagnose(["pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig", *lines])
    assert d.kind is FailureKind.CONFIG_REFUSED and d.fatal
    assert d.facts["refusal"] == "tensor_parallel_size_not_dividing_heads"
    assert (d.facts["num_attention_heads"], d.facts["tensor_parallel_size"]) == (12, 8)


@pytest.mark.parametrize("head", ["(RayWorkerWrapper pid=2931, ip=10.0.0.2) ", "[rank0]: ",
                                  "(EngineCore_DP0 pid=7) (RayWorkerWrapper pid=2931, ip=10.0.0.2) "])
def test_rays_and_torchs_own_heads_are_read_as_the_workers_record(head):
    # Ray's worker prefix carries the node's ip: vLLM's own head, kept; torch's rank tag may come off: either
    # way the record behind them is an error of a worker, not the API server's
    log = ["(APIServer pid=1) INFO 06-09 14:01:50 [api_server.py:1] vLLM API server version 0.20.2",
           head + "ERROR 06-09 14:01:52 [worker.py:1] ValueError: No common block size for 8 (CPU_ATTN: "
                  "[MultipleOf(32)]).",
           head + "ERROR 06-09 14:01:52 [worker.py:1] Worker failed with error 'x'"]
    kept = normalise("\n".join(log)).splitlines()
    assert kept == (log if "pid=" in head else [line.replace(head, "") for line in log])   # [rank0]: is a tag
    d = diagnose(log)
    assert d.kind is FailureKind.BLOCK_SIZE_UNSUPPORTED and d.facts["block_size"] == 8
    if "RayWorkerWrapper" in head:
        assert d.facts["process"] == "RayWorkerWrapper" and d.facts["pid"] == 2931
