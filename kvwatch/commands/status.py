"""`kvwatch status`: each engine's state, command in force, corrections and last failure, from its state file."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kvwatch.boundary import proc_inspect
from kvwatch.boundary.proc_inspect import ProcRef
from kvwatch.errors import KvwatchError
from kvwatch.planner.flag_change import FlagChange
from kvwatch.terminal import printable
from kvwatch.watchdog.config import default_state_dir
from kvwatch.watchdog.state_store import EngineRecord, load_all


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show what kvwatch knows about each engine (from the state files)",
                       description="kvwatch status [--state-dir DIR] [--name NAME] [--json]")
    p.add_argument("--state-dir", metavar="DIR", help="the daemon's state dir")
    p.add_argument("--name", help="only this engine")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def daemon_running(record: EngineRecord) -> bool:
    if not record.kvwatch_pid or record.kvwatch_create_time is None:
        return False
    return proc_inspect.alive(ProcRef(record.kvwatch_pid, record.kvwatch_create_time)) is not None


def run(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    found = load_all(state_dir)
    if args.name:
        found = [(p, r) for p, r in found if p.stem == args.name]
        if not found:
            raise KvwatchError(f"no state for engine {args.name!r} in {state_dir}")
    if not found and not args.json:
        print(f"no engines in {state_dir}")
        return 0
    if args.json:
        out: list[dict[str, object]] = []
        for path, record in found:
            if record is None:
                out.append({"name": path.stem, "error": f"{path}: unreadable or corrupt"})
            else:
                out.append({**record.to_json(), "daemon_running": daemon_running(record)})
        print(json.dumps(out, indent=2))
        return 0
    print("\n\n".join(render(path, record) for path, record in found))
    return 0


def _when(ts: float) -> str:
    """The local time of a wall-clock stamp, "?" for none or one no calendar holds (1e300, NaN)."""
    if not ts:
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, ValueError, OSError):
        return "?"


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "?"


AUTOPILOT_SHOWN = 5   # the autopilot's last changes `kvwatch status` shows (the state file keeps more)


def _describe(change: object) -> str:
    try:
        return FlagChange.from_json(change).describe() if isinstance(change, dict) else "?"
    except (ValueError, TypeError, AttributeError):
        return "?"


def _stamp(value: object) -> str:
    return _when(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def _figure(window: object, key: str) -> str:
    value = window.get(key) if isinstance(window, dict) else None
    return f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def _autopilot_row(change: object) -> str:
    """'2026-12-01 02:10:00 --kv-cache-dtype fp8: kept; preemptions/min 12.0 -> 0.0, tokens/s 30.0 -> 31.2'."""
    if not isinstance(change, dict):
        return "?"
    before, after = change.get("before"), change.get("after")
    row = f"{_stamp(change.get('at'))} {_describe(change.get('change'))}: {change.get('result', '?')}"
    row += (f"; preemptions/min {_figure(before, 'preemptions_per_minute')} -> {_figure(after, 'preemptions_per_minute')}"
            f", tokens/s {_figure(before, 'tokens_per_second')} -> {_figure(after, 'tokens_per_second')}")
    detail = change.get("detail")
    if change.get("result") == "rolled_back" and after is None and isinstance(detail, str) and detail:
        row += f" ({detail})"
    return row


def render(path: Path, record: EngineRecord | None) -> str:
    if record is None:
        return printable(f"engine      {path.stem}\nerror       {path}: unreadable or corrupt")
    running = daemon_running(record)
    if running:
        daemon = f"kvwatch pid {record.kvwatch_pid} running"
    elif record.state in ("stopped", "fatal"):
        daemon = "kvwatch not running"
    else:  # the daemon died without a word (kill -9, power cut): this is only its last word
        daemon = "last known: kvwatch not running"
    rows: list[tuple[str, Any]] = [
        ("engine", record.name),
        ("state", f"{record.state} ({daemon}; updated {_when(record.updated)})"),
        ("reason", record.reason or "-"),
        ("command", " ".join(record.argv) or "-"),
    ]
    if record.argv != record.original_argv:
        rows.append(("configured", " ".join(record.original_argv)))
    for fix in record.preflight:
        rows.append(("preflight", f"{fix.kind}: {fix.change.describe()}"))
    for c in record.corrections:
        rows.append(("correction", f"{_when(c.time)} {c.kind}: {c.change.describe()} ({c.reason})"))
    last = record.last_failure()
    if last is not None:
        rows.append(("last failure", f"{_when(last.time)} {last.kind}: {last.evidence or last.reason}"))
    if record.failure_counts:
        rows.append(("failures", ", ".join(f"{k} {v}" for k, v in sorted(record.failure_counts.items()))))
    if record.restarts:
        rows.append(("restarts", ", ".join(f"{k} {v}" for k, v in sorted(record.restarts.items()))))
    if record.pids and running:
        rows.append(("pids", " ".join(str(p["pid"]) for p in record.pids)))
    for line in record.foreign:
        rows.append(("foreign", line))
    if record.log_kv_tokens is not None:
        rows.append(("KV tokens", f"{record.log_kv_tokens:,} (engine log)"))
    if (found := record.recommendation):
        rows.append(("recommends", f"{found.get('describe', '?')}: {found.get('reason', '')}; KV tokens "
                                   f"{_count(found.get('tokens_before'))} -> {_count(found.get('tokens_after'))}"))
    if (trial := record.autopilot_trial):
        rows.append(("on trial", f"{_describe(trial.get('change'))} (autopilot, since {_stamp(trial.get('applied_at'))})"))
    for change in record.autopilot_changes[-AUTOPILOT_SHOWN:]:
        rows.append(("autopilot", _autopilot_row(change)))
    width = max(len(k) for k, _ in rows)
    # The state file holds engine text (evidence, reasons, the command): shown, never obeyed.
    return printable("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
