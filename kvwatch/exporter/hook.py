"""The exporter of `kvwatch run` (kvwatch.commands.run calls attach).

attach() starts the watch loop and the HTTP server for the supervised engine and returns
the function that stops them. It reads ``supervisor.status`` (an immutable EngineStatus) and
``supervisor.engine_page`` (the supervisor's last read of the engine, which it exports: one read of
the engine per interval) once per tick; it never calls into the supervisor otherwise.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvwatch.exporter.service import Exporter
from kvwatch.exporter.targets import SupervisedEngines

if TYPE_CHECKING:
    from kvwatch.boundary.nvml import Nvml

_LOG = logging.getLogger(__name__)


def _readiness(supervisor: Any) -> tuple[bool, str]:
    """The supervisor's own state, read at request time (an immutable status: no I/O, no lock)."""
    status = supervisor.status
    state = status.state.value
    if status.ending:   # a hung or stalled engine being stopped: no traffic to it meanwhile
        return False, f"{state}, ending: {status.ending}"
    return state == "ready", state


def attach(config: Any, supervisor: Any, nvml: Nvml | None = None,
           status_changed: threading.Event | None = None) -> Callable[[], None]:
    """Serve kvwatch's metrics on ``config.listen`` (TLS/auth from ``config.web_config``),
    snapshotting every ``config.watch.interval_seconds``. KvwatchError when it cannot listen.
    ``nvml``: the process's Nvml, which its owner shuts down (`kvwatch run` passes its one); without
    it the hook opens its own and close() shuts that down. NVML is a source only where it fits the
    host (kvwatch.exporter.sources.nvml_fits). ``status_changed``: set by the supervisor's observer at
    each new status, so the snapshot follows it at once (kvwatch_engine_up 0 as soon as the engine is
    gone, not up to an interval later, nor never when kvwatch exits within the interval)."""
    import os

    from kvwatch.boundary import proc_inspect
    from kvwatch.exporter.sources import nvml_fits
    from kvwatch.watchdog.host_registry import HostRegistry

    own = None
    if nvml is None:
        from kvwatch.boundary.nvml import Nvml as OwnNvml

        nvml = own = OwnNvml()
    # NVML only where it can work: a GPU asked for, or a driver on this host (not on a CPU host).
    nvml_source = nvml.snapshot if nvml_fits(config.device, nvml.driver_present) else None
    if nvml_source is None:
        _LOG.info("exporter: no NVML driver on this host: no nvml collector")
    # The engine sees the GPUs its environment names (config, else kvwatch's own).
    visible = config.engine.environment.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    # The supervisor reads the engine (stalls, pressure); the exporter exports its last read.
    engines = SupervisedEngines(lambda: [supervisor.status], visible_devices=visible,
                                pages=lambda: {config.name: supervisor.engine_page})
    exporter = Exporter(engines,
                        listen=config.listen, web_config=config.web_config,
                        interval=config.watch.interval_seconds, nvml=nvml_source,
                        process_source=proc_inspect.rss, host=HostRegistry(config.state_dir, config.name),
                        all_gpus=config.watch.all_gpus, readiness=lambda: _readiness(supervisor), poke=status_changed)
    exporter.start(first_tick_inline=False)  # the supervisor starts at once; the first tick follows

    def close() -> None:
        exporter.stop()
        if own is not None:
            own.shutdown()

    return close
