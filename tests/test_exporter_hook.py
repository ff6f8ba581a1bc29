"""`kvwatch run`'s exporter hook: attach() serves the supervisor's engine, close() stops it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from engine_support import free_port, http_get
from exporter_support import fixture_plan, samples, value
from nvml_standin import NvmlStandin
from waiting import eventually

from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.errors import KvwatchError
from kvwatch.exporter.hook import attach
from kvwatch.watchdog.config import Config


class _Supervisor:
    """What the hook reads: an immutable EngineStatus in .status, replaced on each change, and the
    last read of the engine in .engine_page (none here: no engine runs)."""

    def __init__(self, status: EngineStatus) -> None:
        self.status = status
        self.engine_page = None


def test_attach_serves_the_supervised_engine_and_close_stops(nvml_standin: NvmlStandin) -> None:
    port = free_port()
    config = replace(Config(), listen=f"127.0.0.1:{port}")
    config = replace(config, watch=replace(config.watch, interval_seconds=0.1))
    argv = ("vllm", "serve", "/nonexistent", "--port", str(free_port()))
    supervisor = _Supervisor(EngineStatus("llm", EngineState.STARTING, plan=fixture_plan("cpu_default"), argv=argv,
                                          failures={"cuda_oom": 1}))
    close = attach(config, supervisor)
    try:
        def page_when(ready: Callable[[dict], bool]) -> dict:
            found = samples(http_get(f"http://127.0.0.1:{port}/metrics")[1])
            return found if ready(found) else {}

        found = eventually(lambda: page_when(lambda f: value(f, "kvwatch_engine_up", engine="llm") is not None), 10, 0.1)
        assert value(found, "kvwatch_engine_state", engine="llm", state="starting") == 1
        assert value(found, "kvwatch_engine_failures_total", engine="llm", kind="cuda_oom") == 1
        assert value(found, "kvwatch_kv_planned_blocks", engine="llm", rank="0") == 16_384
        assert value(found, "kvwatch_collector_success", collector="nvml") == 1  # the stand-in's H100
        # readiness follows the supervisor's state at once (not the next tick): 200 only while READY
        assert http_get(f"http://127.0.0.1:{port}/-/ready") == (503, "starting\n")
        for state, code in ((EngineState.READY, 200), (EngineState.BACKOFF, 503), (EngineState.READY, 200)):
            supervisor.status = replace(supervisor.status, state=state)
            assert http_get(f"http://127.0.0.1:{port}/-/ready") == (code, f"{state.value}\n")
        assert http_get(f"http://127.0.0.1:{port}/-/healthy") == (200, "OK\n")   # liveness: kvwatch itself
        supervisor.status = replace(supervisor.status, state=EngineState.FATAL)
        found = eventually(lambda: page_when(lambda f: value(f, "kvwatch_engine_state", engine="llm",
                                                             state="fatal") == 1), 10, 0.1)
        assert value(found, "kvwatch_engine_state", engine="llm", state="fatal") == 1
    finally:
        close()
    assert http_get(f"http://127.0.0.1:{port}/-/healthy")[0] == 0  # closed


def test_a_busy_listen_address_is_a_kvwatch_error() -> None:
    port = free_port()
    first = attach(replace(Config(), listen=f"127.0.0.1:{port}"), _Supervisor(EngineStatus("a", EngineState.STOPPED)))
    try:
        with pytest.raises(KvwatchError, match="cannot listen"):
            attach(replace(Config(), listen=f"127.0.0.1:{port}"), _Supervisor(EngineStatus("b", EngineState.STOPPED)))
    finally:
        first()


def test_a_new_status_reaches_the_metrics_at_once_not_an_interval_later() -> None:
    # kvwatch_engine_up stayed 1 for the watch interval after the engine died, and for good when
    # kvwatch exited within it (a frozen state disk made that exit take seconds): the supervisor's
    # observer now pokes the watch, which snapshots at once.
    import threading

    from kvwatch.boundary.engine_http import EnginePage

    port = free_port()
    config = replace(Config(), listen=f"127.0.0.1:{port}", device="cpu")
    config = replace(config, watch=replace(config.watch, interval_seconds=600))   # no tick of its own
    supervisor = _Supervisor(EngineStatus("llm", EngineState.READY))
    supervisor.engine_page = EnginePage(True, None)   # type: ignore[assignment]
    changed = threading.Event()
    close = attach(config, supervisor, status_changed=changed)
    try:
        def up() -> float | None:
            return value(samples(http_get(f"http://127.0.0.1:{port}/metrics")[1]), "kvwatch_engine_up", engine="llm")

        changed.set()   # the first snapshot of a 600 s watch comes from a poke too
        eventually(lambda: up() == 1, 10, 0.05)
        supervisor.engine_page = None   # the engine died: the supervisor forgets its page, then publishes
        supervisor.status = replace(supervisor.status, state=EngineState.BACKOFF)
        changed.set()
        eventually(lambda: up() == 0, 5, 0.05)
    finally:
        close()
