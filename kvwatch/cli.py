"""kvwatch's command line: one sub-command per module in kvwatch.commands."""
from __future__ import annotations

import argparse
import logging
import sys
from importlib import import_module

from kvwatch import __version__
from kvwatch.errors import KvwatchError
from kvwatch.exitcodes import EXIT_BAD_INPUT

COMMANDS = ("plan", "diagnose", "run", "status", "export")


class _Parser(argparse.ArgumentParser):
    """argparse that exits with kvwatch's bad-input code (2, as argparse does) and one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"kvwatch: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvwatch", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = import_module(f"kvwatch.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kvwatch.commands.{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def split_engine_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """kvwatch's own arguments, and the engine command after `--`."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    own, engine = split_engine_command(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(own)
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
