"""`kvwatch diagnose`: name the root cause in an engine's output, and the flag change that fixes it.

    kvwatch diagnose [--json] [--served] LOG... [-- ENGINE_COMMAND...]

LOG is a file, `-` for stdin, or a directory or a glob (quoted: 'logs/*.log'). One file (or stdin)
gives the full verdict; several, a directory or a glob give one line per log (path, class, FATAL,
the evidence; the correction when a command is given), for an operator triaging many pods. A log
that holds several containers' lines (`kubectl logs --all-containers --prefix`, `docker compose
logs`) is split by container and each diagnosed alone: the failing ones are reported, one line
each, named LOG[container]. Exit 0 when every failure is a known class, 1 when one is unknown
(kvwatch.exitcodes.EXIT_UNKNOWN_FAILURE), 2 on bad input (nothing matched, a log unreadable).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import stat
import sys
from collections.abc import Iterator
from typing import IO, Any

from kvwatch.boundary.bounded_read import kind_of
from kvwatch.diagnosis import Diagnosis, FailureKind, LogScanner, Remedy, containers, propose_remedy
from kvwatch.diagnosis.diagnose import MAX_LINE_BYTES, diagnose
from kvwatch.errors import KvwatchError
from kvwatch.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNKNOWN_FAILURE
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.terminal import printable


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="name the root cause of an engine failure from its log",
                       description="Diagnose a vLLM failure: kvwatch diagnose [--json] LOG "
                                   "[-- ENGINE_COMMAND...]. Exit 0: a known class; 1: unknown; 2: bad input.")
    p.add_argument("log", metavar="LOG", nargs="+",
                   help="the engine's output (stdout and stderr): a file, - for stdin, or several files, a "
                        "directory or a glob of logs (one line per log); a log of several containers "
                        "(kubectl logs --all-containers --prefix) is diagnosed per container")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--served", action="store_true",
                   help="the engine had been serving: a crash with no other cause is engine_died")
    p.set_defaults(func=run)


_PEEK_BYTES = 1 << 16       # what is read first to tell one source from several containers


class _Replay:
    """A stream that gives back the bytes already read from it first."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head, self._rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if self._head:
            out, self._head = self._head[:n] if n >= 0 else self._head, self._head[n:] if n >= 0 else b""
            return out
        return self._rest.read(n)


def _lines(stream: _Replay) -> Iterator[str]:
    """The stream's lines, decoded, each cut at MAX_LINE_BYTES as the scanner cuts them."""
    carry = b""
    while block := stream.read(1 << 20):
        carry += block
        *whole, carry = carry.split(b"\n")
        for line in whole:
            yield line[:MAX_LINE_BYTES].decode("utf-8", errors="replace")
        carry = carry[:MAX_LINE_BYTES]
    if carry:
        yield carry.decode("utf-8", errors="replace")


def _diagnose_stream(stream: IO[bytes], served: bool) -> list[tuple[str | None, Diagnosis]]:
    """One verdict, or one per container (its tag) when the stream holds several containers' lines."""
    head = stream.read(_PEEK_BYTES)
    replay = _Replay(head, stream)
    sample = head.decode("utf-8", errors="replace").splitlines()[:containers.SAMPLE_LINES]
    shape = containers.tag_shape(sample)
    if shape is None:
        return [(None, LogScanner(served=served).feed_stream(replay).result())]   # type: ignore[arg-type]
    per_container = containers.split(_lines(replay), shape)
    return [(tag, diagnose(lines, served=served)) for tag, lines in per_container.items()]


def _failing(results: list[tuple[str | None, Diagnosis]]) -> list[tuple[str | None, Diagnosis]]:
    """The containers that failed (a class, or an exception at least); all of them when none did."""
    failed = [(tag, d) for tag, d in results if d.kind is not FailureKind.UNKNOWN or d.evidence]
    return failed or results


def _diagnose_source(path: str, served: bool) -> list[tuple[str | None, Diagnosis]]:
    if path == "-":
        return _failing(_diagnose_stream(sys.stdin.buffer, served))
    try:
        # A log is read as a stream: a regular file, or a pipe (`<(journalctl ...)`), whose writer it
        # waits for; a device (/dev/zero) would never end, a directory or socket is no log.
        mode = os.stat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise KvwatchError(f"cannot read {path}: not a log ({kind_of(mode)})")
        with open(path, "rb") as stream:
            return _failing(_diagnose_stream(stream, served))
    except OSError as exc:
        raise KvwatchError(f"cannot read {path}: {exc.strerror or exc}") from None


def logs_of(specs: list[str]) -> list[str] | None:
    """The logs the arguments name, in order; None when they are one file (or stdin) alone."""
    if len(specs) == 1:
        return logs_named(specs[0])
    out: list[str] = []
    for spec in specs:
        named = logs_named(spec)
        if named is None and spec != "-" and not os.path.exists(spec):
            raise KvwatchError(f"cannot read {spec}: No such file or directory")
        out.extend(named if named is not None else [spec])
    if out.count("-") > 1:
        raise KvwatchError("stdin (-) can be read once")
    return out


def logs_named(spec: str) -> list[str] | None:
    """The logs a directory or a glob names, sorted; None when `spec` is one file (or stdin)."""
    if spec == "-" or os.path.isfile(spec):
        return None
    if os.path.isdir(spec):
        return sorted(os.path.join(spec, name) for name in os.listdir(spec)
                      if os.path.isfile(os.path.join(spec, name)))
    if glob.has_magic(spec):
        return sorted(path for path in glob.glob(spec) if os.path.isfile(path))
    return None


def _one_line(path: str, diagnosis: Diagnosis, command: EngineCommand | None, remedy: Remedy | None) -> str:
    parts = [path, diagnosis.kind.value]
    if diagnosis.fatal:
        parts.append("FATAL")
    if command is not None:
        parts.append(f"fix: {remedy.change.describe()}" if remedy and not remedy.same_plan
                     else "fix: restart" if remedy else "fix: none")
    parts.append(_short(diagnosis.evidence or "(no evidence)", 160))
    return printable("  ".join(parts))


def _run_many(paths: list[str], args: argparse.Namespace, command: EngineCommand | None,
              first: list[tuple[str | None, Diagnosis]] | None = None) -> int:
    """One line per log (per failing container); `first`: the first log's verdicts, already read."""
    if not paths:
        raise KvwatchError(f"no log matches {' '.join(args.log)}")
    unknown = unreadable = 0
    results: list[dict[str, Any]] = []
    for path in paths:
        try:
            verdicts = first if first is not None and path == paths[0] else _diagnose_source(path, args.served)
        except KvwatchError as exc:
            unreadable += 1
            results.append({"log": path, "error": str(exc)})
            if not args.json:
                print(printable(f"{path}  error: {exc}"))
            continue
        for tag, diagnosis in verdicts:
            name = path if tag is None else f"{path}[{tag}]"
            remedy = propose_remedy(diagnosis, command, tried=(command.argv,)) if command is not None else None
            unknown += diagnosis.kind is FailureKind.UNKNOWN
            if args.json:
                out: dict[str, Any] = {"log": name, **diagnosis.to_json()}
                if command is not None:
                    out["remedy"] = remedy.to_json() if remedy else None
                results.append(out)
            else:
                print(_one_line(name, diagnosis, command, remedy))
    if args.json:
        print(json.dumps(results, indent=2))
    if unreadable:
        return EXIT_BAD_INPUT
    return EXIT_UNKNOWN_FAILURE if unknown else EXIT_OK


def run(args: argparse.Namespace) -> int:
    command = EngineCommand.parse(args.engine_command) if args.engine_command else None
    many = logs_of(args.log)
    if many is not None:
        return _run_many(many, args, command)
    verdicts = _diagnose_source(args.log[0], args.served)
    if len(verdicts) > 1 or verdicts[0][0] is not None:
        return _run_many(args.log, args, command, verdicts)     # several containers: one line each
    diagnosis = verdicts[0][1]
    remedy = None
    if command is not None:
        # The command given is the one that failed: never propose it again (bar a same-plan restart).
        remedy = propose_remedy(diagnosis, command, tried=(command.argv,))
    if args.json:
        out: dict[str, Any] = diagnosis.to_json()
        if command is not None:
            out["remedy"] = remedy.to_json() if remedy else None
            out["command"] = list(remedy.apply(command).argv) if remedy else None
        print(json.dumps(out, indent=2))
    else:
        print(render(diagnosis, command, remedy))
    return EXIT_UNKNOWN_FAILURE if diagnosis.kind is FailureKind.UNKNOWN else EXIT_OK


def _short(value: object, width: int = 120) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= width else text[:width - 3] + "..."


def render(diagnosis: Diagnosis, command: EngineCommand | None, remedy: Remedy | None) -> str:
    return printable(_render(diagnosis, command, remedy))


def _render(diagnosis: Diagnosis, command: EngineCommand | None, remedy: Remedy | None) -> str:
    facts = {k: v for k, v in diagnosis.facts.items() if k not in ("context", "pattern", "help")}
    rows = [("kind", diagnosis.kind.value),
            ("evidence", _short(diagnosis.evidence or "(none)", 200))]
    if facts:
        rows.append(("facts", ", ".join(f"{k}={_short(v, 80)}" for k, v in facts.items())))
    rows.append(("fatal", "yes: no flag change can fix this" if diagnosis.fatal else "no"))
    if diagnosis.facts.get("help"):
        rows.append(("would help", diagnosis.facts["help"]))
    if command is not None:
        if remedy is None:
            rows.append(("remedy", "none: nothing kvwatch can change fixes this"))
        elif remedy.same_plan:
            rows.append(("remedy", remedy.reason))
        else:
            rows.append(("remedy", f"{remedy.change.describe()} ({remedy.reason})"))
            rows.append(("command", " ".join(remedy.apply(command).argv)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
