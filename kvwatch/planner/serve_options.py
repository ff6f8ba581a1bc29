"""A release's `vllm serve` options, matched as its argparse matches a token (pure).

The options are data (kvwatch/vllm_releases/generated/flags.py, generated from each release's parser). The
matching is Python's argparse (3.11, the interpreter the table was read under), which vLLM's
FlexibleArgumentParser keeps: an exact spelling, else `--opt=value`, else every spelling the token
is a prefix of (allow_abbrev): one is that option, several are refused ("ambiguous option"),
none is an unknown option unless the token is a negative number. Before that, vLLM writes `_` as
`-` in the name of a `--` option (up to its first `.`).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kvwatch.errors import KvwatchError
from kvwatch.planner.units import parse_vllm_int
from kvwatch.values.json_text import parse_json
from kvwatch.vllm_releases.generated import flags


@dataclass(frozen=True)
class ServeOption:
    name: str                       # kvwatch's name for it: its first `--` spelling that sets it
    spellings: tuple[str, ...]      # every spelling that sets it (aliases such as -tp included)
    negative: frozenset[str]        # spellings that unset a 'bool' (--no-X; from 0.33 --disable-X too)
    dest: str
    form: str                       # 'value' (takes values), 'switch' (sets a constant) or 'bool'
    nargs: Any                      # None (one value), '?', '+', '*' or a count
    choices: tuple[str, ...] | None
    const: Any
    type: str | None                # the name of the function that converts a value ('int', ...)
    source: str                     # vllm/path.py:LINE in the release this form of it is from

    @property
    def takes_value(self) -> bool:
        return self.form == "value" and self.nargs != 0


@dataclass(frozen=True)
class Match:
    """What the parser makes of one token that looks like an option."""
    option: ServeOption | None      # None: unknown (or ambiguous) to this release
    spelling: str                   # the spelling matched, or the token's name when none
    explicit: str | None            # the value after `=`, if any
    ambiguous: tuple[str, ...] = ()  # the spellings an ambiguous prefix could match, in the parser's order


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_NAME = re.compile(r"(?<=--)[^.]*")


def vllm_spelling(token: str) -> str:
    """The token as vLLM's FlexibleArgumentParser passes it to argparse (`--block_size=8` -> `--block-size=8`)."""
    if not token.startswith("--"):
        return token
    name, eq, value = token.partition("=")
    return _NAME.sub(lambda m: m.group(0).replace("_", "-"), name, count=1) + eq + value


class ReleaseOptions:
    """The options of one release's `vllm serve` parser."""

    def __init__(self, release: str, table: dict[str, flags.Option]) -> None:
        self.release = release
        self.by_name: dict[str, ServeOption] = {}
        self.by_spelling: dict[str, ServeOption] = {}
        for name, (spellings, negative, dest, form, nargs, choices, const, convert, source) in table.items():
            option = ServeOption(name, spellings, frozenset(negative), dest, form, nargs, choices, const, convert,
                                 source)
            self.by_name[name] = option
            for spelling in (*spellings, *negative):
                self.by_spelling[spelling] = option
        # argparse tries spellings in the order it registered them; ours are sorted, which only
        # changes the order of the candidates an ambiguity names, never whether there is one.
        self._spellings = tuple(sorted(self.by_spelling))

    def match(self, token: str) -> Match | None:
        """None for a positional (a value, the model, a negative number); else what the option is."""
        if not token or token[0] != "-":
            return None
        if token in self.by_spelling:
            return Match(self.by_spelling[token], token, None)
        if len(token) == 1:
            return None
        if "=" in token:
            name, explicit = token.split("=", 1)
            if name in self.by_spelling:
                return Match(self.by_spelling[name], name, explicit)
        candidates = self._candidates(token)
        if len(candidates) > 1:
            return Match(None, token.split("=", 1)[0], None, tuple(s for s, _ in candidates))
        if candidates:
            spelling, value = candidates[0]
            return Match(self.by_spelling[spelling], spelling, value)
        if _NEGATIVE_NUMBER.match(token) or " " in token:
            return None
        return Match(None, token, None)

    def _candidates(self, token: str) -> list[tuple[str, str | None]]:
        if token[1] == "-":
            prefix, _, explicit = token.partition("=")
            value = explicit if "=" in token else None
            return [(s, value) for s in self._spellings if s.startswith(prefix)]
        # a single-dash token: `-tp4` is -tp... only when "-t" is an option; argparse's short rule
        out: list[tuple[str, str | None]] = []
        for s in self._spellings:
            if s == token[:2]:
                out.append((s, token[2:]))
            elif s.startswith(token):
                out.append((s, None))
        return out

    def name_of(self, flag: str) -> str:
        """kvwatch's name for the option `flag` (a spelling or a unique prefix); `flag` when it names none."""
        found = self.match(vllm_spelling(flag))
        return found.option.name if found is not None and found.option is not None else flag


def _human_int(text: str) -> int:
    return parse_vllm_int(text)


def _human_int_or_auto(text: str) -> int:
    return -1 if text.strip() in ("-1",) or text.strip().lower() == "auto" else parse_vllm_int(text)


# vLLM's union_dict_and_str, the type of --additional-config, --hf-overrides and the other options
# whose config field takes a dict or another type: a value in braces is JSON, any other a string
# (vLLM 0.33.0, vllm/engine/arg_utils.py:182-185; the same from 0.10.2, arg_utils.py:92). json.loads's
# ValueError on malformed JSON is argparse's "Value ... cannot be converted" (arg_utils.py:161-168).
_IN_BRACES = re.compile(r"(?s)^\s*{.*}\s*$")


def union_dict_and_str(text: str) -> object:
    """The value vLLM's parser makes of `text` for a union_dict_and_str option (a dict or a string)."""
    return parse_json(text) if _IN_BRACES.match(text) else str(text)


# The value types kvwatch can check as the parser does (by the name the table records). Others pass.
_CONVERTERS: dict[str, Callable[[str], object]] = {
    "int": int, "float": float, "human_readable_int": _human_int, "human_readable_int_or_auto": _human_int_or_auto,
    "union_dict_and_str": union_dict_and_str}


def _type_name(option: ServeOption) -> tuple[str, bool]:
    """The converter's name of `option`'s type, and whether it is wrapped in optional_type."""
    name = option.type or ""
    inner = name.removeprefix("optional_type(").removesuffix(")")
    return inner, inner != name


def convert_value(option: ServeOption, value: str) -> object:
    """`value` as the parser converts it for `option` (unchanged where kvwatch has no converter for
    its type). Raises what the converter raises; invalid_value says it as argparse does."""
    inner, optional = _type_name(option)
    convert = _CONVERTERS.get(inner)
    if convert is None:
        return value
    if optional and value == "None":     # optional_type: "None" is None
        return None
    return convert(value)


def invalid_value(option: ServeOption, value: str) -> str | None:
    """argparse's complaint about `value` for `option` (its type, then its choices), if any."""
    inner, _optional = _type_name(option)
    try:
        converted = convert_value(option, value)
    except json.JSONDecodeError as e:
        return f"invalid {inner} value: {value!r} is not valid JSON ({e})"
    except (ValueError, KvwatchError):
        return f"invalid {inner} value: {value!r}"
    if option.choices is not None and str(converted) not in option.choices:
        return f"invalid choice: {value!r}"
    return None


def known_releases() -> tuple[str, ...]:
    return tuple(flags.PARSERS)


@lru_cache(maxsize=8)
def release_options(release: str) -> ReleaseOptions:
    """The options of `release`, a release of the table (vllm_releases.resolve picks one for any other)."""
    if release not in flags.PARSERS:
        raise KeyError(f"vLLM {release}: not in kvwatch's option table")
    table = dict(flags.BASE)
    for name, (changed, removed) in flags.CHANGES.items():
        for key in removed:
            table.pop(key, None)
        table.update(changed)
        if name == release:
            break
    if release == flags.BASE_RELEASE:
        table = dict(flags.BASE)
    return ReleaseOptions(release, table)
