"""kvwatch's command line: one sub-command per module in kvwatch.commands."""
from __future__ import annotations

import argparse
import logging
import sys
from importlib import import_module

from kvwatch import __version__
from kvwatch.errors import KvwatchError
from kvwatch.exitcodes import EXIT_BAD_INPUT

# Sub-command -> one-line help. Only the chosen command's module is imported: `kvwatch --help`
# and `kvwatch plan` never load the exporter, NVML or psutil.
COMMANDS = {
    "plan": "plan the KV cache of an engine command",
    "diagnose": "name the root cause of an engine failure from its log",
    "run": "supervise a vLLM engine, correcting its plan until it serves",
    "status": "show what kvwatch knows about each engine (from the state files)",
    "export": "export metrics for an engine kvwatch did not start",
}


class _Parser(argparse.ArgumentParser):
    """argparse that exits with kvwatch's bad-input code (2, as argparse does) and one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"kvwatch: {message}\n")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; `selected` names the one sub-command whose module (and arguments) to load."""
    parser = _Parser(prog="kvwatch", description="Plan the KV cache of vLLM engines, supervise them, "
                     "correct their failures and export their metrics to Prometheus.")
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, summary in COMMANDS.items():
        if name == selected:
            import_module(f"kvwatch.commands.{name}").add_parser(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _selected_command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def split_engine_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """kvwatch's own arguments, and the engine command after `--`."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    own, engine = split_engine_command(list(sys.argv[1:] if argv is None else argv))
    args = build_parser(_selected_command(own)).parse_args(own)
    args.engine_command = engine
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s kvwatch %(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except KvwatchError as exc:
        print(f"kvwatch: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
