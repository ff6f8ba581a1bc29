"""Engine sources for the watch loop: supervised engines (`kvwatch run`) and one external
engine (`kvwatch export`). Runs in the watch thread: reading a model's config.json here is fine."""
from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

from kvwatch.boundary.device_probe import installed_vllm_text
from kvwatch.boundary.engine_http import EnginePage
from kvwatch.boundary.model_source import load_model_source
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.errors import KvwatchError
from kvwatch.exporter.actual import KvContext
from kvwatch.exporter.watch import EngineTarget
from kvwatch.planner.devices import Device, parse_compute_capability
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import ruleset_for

_LOG = logging.getLogger(__name__)


def device_of_plan(plan: Plan) -> Device:
    """The device a plan was made for, as far as the page size needs it."""
    if plan.compute_capability == "cpu":
        return Device("cpu", plan.device)
    try:
        return Device("cuda", plan.device, parse_compute_capability(plan.compute_capability))
    except KvwatchError:
        return Device("cuda", plan.device)


def kv_context(command: EngineCommand, device: Device) -> KvContext:
    """The model's geometry (its config.json) and the command's flags; KvwatchError if unreadable."""
    settings = command.settings()
    geometry = geometry_from_config(load_model_source(settings.model).config, command.release)
    return KvContext(geometry, settings, device, ruleset_for(installed_vllm_text()), command)


class SupervisedEngines:
    """For `kvwatch run`: the supervisor's EngineStatus values as watch targets.

    ``statuses`` is called once per tick (from the watch thread) and must return the current
    immutable EngineStatus of every engine. URLs come from each engine's command
    (--host/--port), the model geometry from its config.json (read once per command).
    ``pages`` (engine name -> the supervisor's last read of it) makes the supervisor the one reader
    of the engine: the watch exports that read instead of reading /health and /metrics again.
    """

    def __init__(self, statuses: Callable[[], Sequence[EngineStatus]], visible_devices: str | None = None,
                 pages: Callable[[], Mapping[str, EnginePage | None]] | None = None) -> None:
        self._statuses = statuses
        self._visible = visible_devices
        self._pages = pages
        self._contexts: dict[tuple[tuple[str, ...], str, str], KvContext | None] = {}

    def __call__(self) -> list[EngineTarget]:
        targets = []
        pages = self._pages() if self._pages is not None else {}
        for status in self._statuses():
            url = context = None
            if status.argv:
                try:
                    command = EngineCommand.parse(status.argv)
                    url = command.health_url()
                    context = self._context(command, status.plan)
                except KvwatchError as exc:
                    _LOG.debug("engine %s: %s", status.name, exc)
            targets.append(EngineTarget(status=status, url=url, context=context, visible_devices=self._visible,
                                        read_by_owner=self._pages is not None, page=pages.get(status.name)))
        return targets

    def _context(self, command: EngineCommand, plan: Plan | None) -> KvContext | None:
        if plan is None:
            return None
        key = (command.argv, plan.device, plan.compute_capability)
        if key not in self._contexts:
            if len(self._contexts) > 64:  # commands change only on corrections; stay bounded anyway
                self._contexts.clear()
            try:
                self._contexts[key] = kv_context(command, device_of_plan(plan))
            except KvwatchError as exc:
                _LOG.warning("no actual KV figures for %s: %s", command.model, exc)
                self._contexts[key] = None
        return self._contexts[key]


def external_engine(name: str, url: str, context: KvContext | None = None,
                    pids: Sequence[int] = (), find_processes: bool = False) -> Callable[[], list[EngineTarget]]:
    """For `kvwatch export`: one engine kvwatch did not start (state derived by the watch).
    With ``find_processes`` (no --engine-pid, the URL on this host) its processes are the tree
    of the process listening on the URL's port, looked up every tick (the engine may restart)."""
    if not find_processes:
        visible = _visible_devices(pids)
        target = EngineTarget(status=EngineStatus(name=name, state=EngineState.STARTING, pids=tuple(pids)),
                              url=url, context=context, external=True, pids_known=bool(pids),
                              visible_devices=visible)
        return lambda: [target]
    return _ListeningEngine(name, url, context)


def _visible_devices(pids: Sequence[int]) -> str | None:
    """The engine's CUDA_VISIBLE_DEVICES, read from its first readable process."""
    from kvwatch.boundary import proc_inspect

    for pid in pids:
        value = proc_inspect.environ_value(pid, "CUDA_VISIBLE_DEVICES")
        if value is not None:
            return value
    return None


class _ListeningEngine:
    """An external engine found by its port: the listening process and its descendants."""

    def __init__(self, name: str, url: str, context: KvContext | None) -> None:
        self._name, self._url, self._context = name, url, context
        self._port = urllib.parse.urlsplit(url).port or (443 if url.startswith("https") else 80)
        self._said: str | None = None

    def __call__(self) -> list[EngineTarget]:
        from kvwatch.boundary import proc_inspect

        owners = proc_inspect.listening_on(self._port)
        pids: tuple[int, ...] = ()
        if len(owners) == 1 and owners[0] is not None:
            pids = tuple(p.pid for p in proc_inspect.tree(owners[0]))
        self._say(None if pids else
                  f"engine {self._name}: cannot tell which processes are the engine (listening on port "
                  f"{self._port}: {owners or 'nobody'}); pass --engine-pid to split GPU memory")
        status = EngineStatus(name=self._name, state=EngineState.STARTING, pids=pids)
        return [EngineTarget(status=status, url=self._url, context=self._context, external=True,
                             pids_known=bool(pids), visible_devices=_visible_devices(pids))]

    def _say(self, problem: str | None) -> None:
        if problem != self._said:
            if problem:
                _LOG.warning("%s", problem)
            elif self._said:
                _LOG.info("engine %s: found its processes", self._name)
            self._said = problem
