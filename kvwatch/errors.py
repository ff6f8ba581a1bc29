"""Errors that reach the user as one clear line and an exit code."""
from __future__ import annotations


class KvwatchError(Exception):
    """Bad input or an unusable environment: printed as one line, exit 2."""

    exit_code = 2


class ConfigError(KvwatchError):
    """A model config.json or a kvwatch config file that cannot be used."""


class CommandError(KvwatchError):
    """An engine command line that cannot be understood."""
