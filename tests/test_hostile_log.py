"""What an engine echoes is not what it says: text from requests (prompts, request bodies, outputs,
access log lines) never names a failure class, and a plan that served is not "corrected" for a
start-up class. The lines below are vLLM 0.32's own record formats (entrypoints/serve/utils/
request_logger.py logs prompts and request bodies at DEBUG with %r / JSON, outputs at INFO)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.diagnosis import FailureKind, diagnose, propose_remedy
from kvwatch.planner.engine_args import EngineCommand

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
BLOCK = "No common block size for 128 (CPU_ATTN: [MultipleOf(4096)])"
KERNEL = ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 102400, "
          "Hardware limit: 101376. Reducing block sizes or num_stages may help.")
DIED = (LOGS / "cpu_engine_died.log").read_text().splitlines()
READY = ["(APIServer pid=7) INFO:     Application startup complete."]


def request_lines(payload: str) -> list[list[str]]:
    """The ways vLLM and uvicorn write a client's text into the log."""
    return [
        [f"(APIServer pid=7) DEBUG 11-30 11:00:00 [request_logger.py:55] Request cmpl-1 details: prompt: {payload!r}, "
         "prompt_token_ids: [1, 2], prompt_embeds shape: None."],
        [f'(APIServer pid=7) DEBUG 11-30 11:00:00 [request_logger.py:76] Request cmpl-1 JSON body: '
         f'{{"prompt": [1, 2], "user": "{payload}"}}'],
        [f"(APIServer pid=7) INFO 11-30 11:00:01 [request_logger.py:108] Generated response cmpl-1: output: {payload!r}, "
         "finish_reason: length"],
        [f'INFO:     127.0.0.1:5000 - "GET /v1/models?q={payload} HTTP/1.1" 404 Not Found'],
        # a raw newline inside the text (a logger that does not escape it): the line continues the record
        ["(APIServer pid=7) INFO 11-30 11:00:00 [somewhere.py:1] prompt: 'hello", payload + "'"],
    ]


@pytest.mark.parametrize("shape", range(5))
@pytest.mark.parametrize("payload,kind", [(BLOCK, "block_size_unsupported"), (KERNEL, "kernel_out_of_resources")])
def test_a_request_cannot_name_the_failure(shape: int, payload: str, kind: str) -> None:
    echoed = request_lines(payload)[shape]
    d = diagnose(DIED[:40] + echoed + DIED[40:], served=True)
    assert d.kind is FailureKind.ENGINE_DIED and not d.fatal, (shape, d)
    assert "MultipleOf(4096)" not in str(d.facts)
    remedy = propose_remedy(d, EngineCommand.parse(["vllm", "serve", "m"]))
    assert remedy is not None and remedy.same_plan          # restart, same plan: nothing learned


@pytest.mark.parametrize("shape", range(5))
def test_echoed_text_is_ignored_before_ready_too(shape: int) -> None:
    """A start that fails for another reason: the echoed block-size words are not its class."""
    echoed = request_lines(BLOCK)[shape]
    lines = echoed + ["(EngineCore pid=9) ERROR 11-30 11:00:02 [core.py:1] EngineCore failed to start.",
                      "RuntimeError: something else broke"]
    assert diagnose(lines).kind is FailureKind.UNKNOWN


def test_a_start_up_class_after_serving_is_a_death_not_a_correction() -> None:
    """vLLM's own error record of a start-up class, after the engine served with this plan: the plan
    was legal (it served), so the engine is restarted as it was, never 'corrected'."""
    lines = READY + [f"(EngineCore pid=9) ERROR 11-30 11:00:02 [core.py:1] ValueError: {BLOCK}"] + DIED[-5:]
    d = diagnose(lines)
    assert d.kind is FailureKind.ENGINE_DIED and d.facts["ignored"]["kind"] == "block_size_unsupported"
    # the same line before READY is the start's failure, as always
    assert diagnose(lines[1:2]).kind is FailureKind.BLOCK_SIZE_UNSUPPORTED


def test_the_real_fixtures_still_name_their_class() -> None:
    assert diagnose((LOGS / "cpu_block_size_8.log").read_text().splitlines()).kind is FailureKind.BLOCK_SIZE_UNSUPPORTED
    assert diagnose((LOGS / "gpu_kernel_oor_sm120_fp8.log").read_text().splitlines()).kind \
        is FailureKind.KERNEL_OUT_OF_RESOURCES


# The API server writes an ERROR record that quotes text a client steers (a tool-call parser quoting
# the model's output, hermes_tool_parser.py-style), then its engine core dies or fails on its own.
def api_error_quoting(text: str) -> str:
    return (f"(APIServer pid=11556) ERROR 11-30 01:53:59 [hermes_tool_parser.py:101] Error in extracting tool "
            f"call from response: {text}")


def test_the_api_servers_quote_does_not_name_an_engine_death() -> None:
    """A real death (cpu_engine_died.log: the core killed, the API server's EngineDeadError) after an
    API-server error quoting "CUDA out of memory": the core died, so the API server's text is not
    its root cause: ENGINE_DIED, no memory correction."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity"
    crash = DIED.index(next(line for line in DIED if "AsyncLLM output_handler failed" in line))
    log = DIED[:crash] + [api_error_quoting(oom)] + DIED[crash:]
    d = diagnose(log)
    assert d.kind is FailureKind.ENGINE_DIED, d
    assert "out of memory" not in (d.evidence or "") and d.evidence.startswith("(APIServer")


def test_the_engine_cores_own_error_wins_over_the_api_servers_quote() -> None:
    """A start-up failure the core reports (cpu_block_size_8.log: its block size refused) with an
    API-server error quoting a fatal kernel limit before it: the core's failure is the root cause, not
    the quote (which would have ended kvwatch with exit 78)."""
    lines = (LOGS / "cpu_block_size_8.log").read_text().splitlines()
    first_core_error = next(i for i, line in enumerate(lines) if line.startswith("(EngineCore") and " ERROR " in line)
    log = lines[:first_core_error] + [api_error_quoting(KERNEL)] + lines[first_core_error:]
    assert diagnose(lines).kind is FailureKind.BLOCK_SIZE_UNSUPPORTED
    d = diagnose(log)
    assert d.kind is FailureKind.BLOCK_SIZE_UNSUPPORTED and not d.fatal, d
    assert d.facts["process"] == "Worker"    # the worker's own record, as in the log without the quote


def test_an_api_server_that_fails_alone_still_names_its_failure() -> None:
    """No engine core ever ran (cpu_refusal_max_model_len.log: vLLM refused its configuration in the
    API server, the only process in the log): the API server's own records are the failure."""
    lines = (LOGS / "cpu_refusal_max_model_len.log").read_text().splitlines()
    assert not any(line.startswith(("(EngineCore", "(Worker")) for line in lines)
    d = diagnose(lines)
    assert d.kind is FailureKind.CONFIG_REFUSED, d
    assert "User-specified max_model_len (300000)" in (d.evidence or ""), d
