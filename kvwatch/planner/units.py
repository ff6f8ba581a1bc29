"""Byte sizes in and out: vLLM's human-readable ints, and GiB/MiB suffixes."""
from __future__ import annotations

import re

from kvwatch.errors import KvwatchError

# vLLM's human_readable_int: lower-case suffixes are decimal (1k = 1000),
# upper-case are binary (1K = 1024); a fraction is only allowed with a suffix.
_VLLM_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_VLLM_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_VLLM_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")

# Sizes a person types on kvwatch's own command line: 96GiB, 80GB, 1.5TiB, 1024.
_UNIT_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNIT_FACTORS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10, "ki": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20, "mi": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30, "gi": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40, "ti": 2**40,
}


def parse_vllm_int(text: str) -> int:
    """Parse an int the way vLLM's `human_readable_int` does ("1k", "2G", "25.6k")."""
    text = text.strip()
    match = _VLLM_INT.match(text)
    if match:
        number, suffix = match.groups()
        factor = _VLLM_DECIMAL.get(suffix) or _VLLM_BINARY[suffix]
        value = float(number) * factor
        if value != int(value):
            raise KvwatchError(f"{text!r} is not a whole number of bytes")
        return int(value)
    try:
        return int(text)
    except ValueError:
        raise KvwatchError(f"{text!r} is not an integer (vLLM accepts e.g. 1073741824, 1G, 500m)") from None


def parse_size(text: str) -> int:
    """Parse a size such as 96GiB, 80GB, 512MiB or a plain byte count."""
    match = _UNIT_SIZE.match(text)
    if not match:
        raise KvwatchError(f"{text!r} is not a size (examples: 96GiB, 80GB, 1073741824)")
    number, unit = match.groups()
    return int(float(number) * _UNIT_FACTORS[(unit or "").lower()])


def format_bytes(n: int | float) -> str:
    """Binary units with two decimals: 1.50 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
