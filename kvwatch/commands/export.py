"""`kvwatch export`: the standalone exporter for a vLLM engine kvwatch did not start.

    kvwatch export --engine-url http://127.0.0.1:8000 [--name NAME] [--model DIR]
                   [--listen HOST:PORT] [--web-config FILE] [--interval S]
                   [--engine-pid PID ...] [--no-nvml] [--stall-timeout S] [--pressure-window S]
                   [DEVICE] [-- ENGINE_COMMAND...]

Reads the engine's /health and /metrics and NVML each interval and serves kvwatch's
metrics. With --model (or the engine's command after `--`), it also computes the planned
and actual KV bytes: the plan from the model's config.json, the engine's flags (as far as
they are given) and the block size, KV dtype and KV memory the engine reports, and, under KV
pressure, the planner's one recommended change. A stall (requests running, no token for
--stall-timeout) is counted as a `stalled` failure and makes /-/ready 503 while it lasts.
Runs until SIGTERM or SIGINT; exit 0, or 2 on bad input.
"""
from __future__ import annotations

import argparse
import logging
import select
import signal
import socket
import threading
import urllib.parse

from kvwatch.commands.plan import add_device_arguments, device_from_args
from kvwatch.errors import KvwatchError
from kvwatch.exitcodes import EXIT_OK
from kvwatch.exporter.actual import KvContext
from kvwatch.exporter.service import Exporter
from kvwatch.exporter.serving import ServingJudge
from kvwatch.exporter.targets import external_engine, kv_context
from kvwatch.exporter.watch import DEFAULT_INTERVAL
from kvwatch.listen import DEFAULT_LISTEN
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.watchdog.config import EngineConfig, bounded_seconds

_LOG = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export metrics for an engine kvwatch did not start",
                       description="Serve kvwatch's metrics for a running vLLM engine: "
                                   "kvwatch export --engine-url URL [options] [-- ENGINE_COMMAND...]")
    p.add_argument("--engine-url", required=True, metavar="URL", help="the engine's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--name", default="vllm", help="the value of the `engine` label (default: vllm)")
    p.add_argument("--model", metavar="DIR", help="the model directory (config.json): enables planned/actual KV bytes")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"default {DEFAULT_LISTEN}")
    p.add_argument("--web-config", metavar="FILE", help="TLS and basic auth (Prometheus exporter-toolkit format)")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, metavar="S",
                   help=f"seconds between snapshots (default {DEFAULT_INTERVAL:g})")
    p.add_argument("--engine-pid", type=int, action="append", default=[], metavar="PID",
                   help="a pid of the engine's processes (repeat for each). Default: when the engine URL is "
                        "on this host, the process listening on its port and that process's tree")
    p.add_argument("--no-nvml", action="store_true", help="no GPU metrics (a CPU engine)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="the state directory every kvwatch on this host shares (which processes are "
                        "engines); default as for kvwatch run")
    p.add_argument("--stall-timeout", type=float, default=EngineConfig.stall_timeout_seconds, metavar="S",
                   help="requests running and no token for S seconds is a stall (0: no stall detection; "
                        f"default {EngineConfig.stall_timeout_seconds:g}, as engine.stall_timeout_seconds)")
    p.add_argument("--pressure-window", type=float, default=EngineConfig.pressure_window_seconds, metavar="S",
                   help="the window KV pressure is judged over (default "
                        f"{EngineConfig.pressure_window_seconds:g}, as engine.pressure_window_seconds)")
    p.add_argument("--all-gpus", action="store_true",
                   help="export every GPU of the host (one instance per host), not only the engine's")
    add_device_arguments(p)
    p.set_defaults(func=run)


def _check_url(url: str) -> str:
    try:
        parsed = urllib.parse.urlsplit(url)
        _ = parsed.port   # raises on a port that is not a number of 0-65535
    except ValueError:
        raise KvwatchError(f"--engine-url {url[:200]!r}: expected http://HOST:PORT") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise KvwatchError(f"--engine-url {url[:200]!r}: expected http://HOST:PORT")
    if parsed.username is not None or parsed.password is not None:
        # never sent (vLLM's /metrics takes no credentials) and they would end up in logs
        raise KvwatchError("--engine-url: credentials in the URL are not supported; give http://HOST:PORT")
    return url.rstrip("/")


def _context(args: argparse.Namespace) -> KvContext | None:
    if args.engine_command:
        command = EngineCommand.parse(args.engine_command)
        if args.model:
            command = command.with_flag("--model", args.model)
    elif args.model:
        command = EngineCommand.parse(["vllm", "serve", args.model])
    else:
        return None
    return kv_context(command, device_from_args(args))


def _wait_for_signal(stop: threading.Event) -> None:
    """Block the main thread until a signal handler sets `stop`, without waking to look.

    The kernel may hand SIGTERM to another thread (the watch loop's, a connection's), and Python
    runs the handler only when the main thread runs again: the signal module's C handler, in
    whatever thread took the signal, writes a byte to the wakeup descriptor this thread waits on.
    (It used to look every 0.5 s: 2 wake-ups a second, 2-4 % of kvwatch export's CPU.)"""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        while not stop.is_set():
            select.select([reader], [], [])
            try:
                reader.recv(4096)   # the signal numbers: the handlers have run or run now
            except BlockingIOError:
                pass
    finally:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()


def run(args: argparse.Namespace) -> int:
    url = _check_url(args.engine_url)
    bounded_seconds(args.interval, f"--interval {args.interval:g}", "watch.interval_seconds")  # 1e-300 would spin
    stall = bounded_seconds(args.stall_timeout, f"--stall-timeout {args.stall_timeout:g}",
                            "engine.stall_timeout_seconds")
    window = bounded_seconds(args.pressure_window, f"--pressure-window {args.pressure_window:g}",
                             "engine.pressure_window_seconds")
    context = _context(args)
    nvml = None
    nvml_source = None
    if not args.no_nvml:
        from kvwatch.boundary.nvml import shared  # only here: --no-nvml never loads the library
        from kvwatch.exporter.sources import nvml_fits
        nvml = shared()  # the one the device chooser reads too
        # NVML only where it can work (as for kvwatch run): a GPU asked for, or a driver on this host
        asked = "gpu" if args.device == "gpu" or args.gpu is not None else (args.device or "")
        if nvml_fits(asked, nvml.driver_present):
            nvml_source = nvml.snapshot
        else:
            _LOG.info("exporter: no NVML driver on this host: no nvml collector")
    if any(pid <= 0 for pid in args.engine_pid):
        raise KvwatchError("--engine-pid: expected a positive process id")
    from kvwatch.boundary import proc_inspect
    from kvwatch.watchdog.config import default_state_dir
    from kvwatch.watchdog.host_registry import HostRegistry

    local = proc_inspect.is_local_host(urllib.parse.urlsplit(url).hostname or "")
    engines = external_engine(args.name, url, context, args.engine_pid,
                              find_processes=not args.engine_pid and local)
    if not args.engine_pid and not local:
        _LOG.warning("engine %s is not on this host: its GPU memory is not split (no --engine-pid)", args.name)
    host = HostRegistry(args.state_dir or default_state_dir(), args.name)
    exporter = Exporter(engines, listen=args.listen, web_config=args.web_config, interval=args.interval,
                        nvml=nvml_source, host=host, all_gpus=args.all_gpus,
                        judge=lambda name: ServingJudge(name, stall, window),
                        # the engine's processes are on this host: their resident memory too
                        process_source=proc_inspect.rss if args.engine_pid or local else None)
    stop = threading.Event()
    # SIGTERM/SIGINT stop cleanly (the claim withdrawn; more of them while stopping change nothing).
    # SIGHUP (a closed terminal, an operator's "reload") is ignored with a line: nothing is re-read.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: _LOG.info(
        "signal: SIGHUP ignored: kvwatch export reads its flags at start only (restart it to change them)"))
    exporter.start()
    _LOG.info("exporting engine %s at %s on %s/metrics%s", args.name, url, exporter.url,
              "" if context else " (no --model: no planned/actual KV figures)")
    try:
        _wait_for_signal(stop)
    finally:
        exporter.stop()
        if nvml is not None:
            nvml.shutdown()
        # On the way out: Python's finalization puts a Python handler back to the default, and a
        # SIGTERM then would end the process by the signal (exit -15) instead of this clean exit.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    return EXIT_OK
