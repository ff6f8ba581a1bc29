"""The exporter as one object: the watch loop and the HTTP server, wired the same way for
`kvwatch run` (supervised engines) and `kvwatch export` (one external engine).

    exporter = Exporter(SupervisedEngines(supervisor.statuses), listen="127.0.0.1:9400",
                        web_config="/etc/kvwatch/web.yml", nvml=shared().snapshot,
                        process_source=proc_inspect.rss)
    exporter.start()   # binds (KvwatchError if it cannot), first snapshot, then serves
    ...
    exporter.stop()
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from kvwatch.exporter.collector import KvwatchCollector
from kvwatch.exporter.server import MetricsServer
from kvwatch.exporter.serving import ServingJudge
from kvwatch.exporter.snapshot import WatchSnapshot
from kvwatch.exporter.watch import DEFAULT_INTERVAL, EngineSource, HostView, NvmlSource, ProcessSource, Watch
from kvwatch.exporter.web_config import load_web_config
from kvwatch.listen import DEFAULT_LISTEN

_LOG = logging.getLogger(__name__)


class Exporter:
    def __init__(self, engines: EngineSource, listen: str = DEFAULT_LISTEN,
                 web_config: str | Path | None = None, interval: float = DEFAULT_INTERVAL,
                 nvml: NvmlSource | None = None, process_source: ProcessSource | None = None,
                 host: HostView | None = None, all_gpus: bool = False,
                 readiness: Callable[[], tuple[bool, str]] | None = None,
                 judge: Callable[[str], ServingJudge] = ServingJudge, poke: threading.Event | None = None) -> None:
        config = load_web_config(web_config) if web_config else None  # ConfigError: one line
        self.watch = Watch(engines, nvml=nvml, process_source=process_source, interval=interval,
                           on_snapshot=lambda _: self.server.prerender(), host=host, all_gpus=all_gpus,
                           judge=judge, poke=poke)
        self._host = host
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(KvwatchCollector(lambda: self.watch.snapshot))
        # binds now: errors before anything runs; renders each snapshot once, in the watch loop
        self.server = MetricsServer(self.registry, listen, config, version=lambda: self.watch.snapshot,
                                    readiness=readiness or self._engines_ready)

    def _engines_ready(self) -> tuple[bool, str]:
        """By default, ready while every engine of the latest snapshot is READY, answers /health and
        is not stalled (an external engine's stall: its status's `ending`)."""
        engines = self.watch.snapshot.engines
        if not engines:
            return False, "starting"
        ending = [f"{e.name}: {e.status.ending}" for e in engines if e.status.ending]
        if ending:
            return False, "; ".join(ending)
        ready = all(e.up and e.status.state.value == "ready" for e in engines)
        states = sorted({e.status.state.value if e.up else "down" for e in engines})
        return ready, ",".join(states)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def snapshot(self) -> WatchSnapshot:
        return self.watch.snapshot

    def start(self, first_tick_inline: bool = True) -> None:
        self.watch.start(first_tick_inline=first_tick_inline)
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.watch.stop()
        withdraw = getattr(self._host, "withdraw", None)
        if withdraw is not None:
            withdraw()   # our engine's processes are no longer claimed by anyone

    def __enter__(self) -> Exporter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
