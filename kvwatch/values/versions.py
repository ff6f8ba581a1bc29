"""vLLM versions as kvwatch compares them: the rule tables and the memory budget pick by release (pure)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from kvwatch.errors import KvwatchError


@dataclass(frozen=True, order=True)
class VllmVersion:
    parts: tuple[int, int, int]
    text: str = ""

    def __str__(self) -> str:
        return self.text or ".".join(map(str, self.parts))


_VERSION = re.compile(r"^v?(\d{1,3})\.(\d{1,3})(?:\.(\d{1,4}))?(?:[.+\-a-z].*)?$")


def parse_version(text: str) -> VllmVersion:
    """`0.10.1.1`, `0.6.5.dev12+g...`, `v0.32.0` -> (major, minor, patch)."""
    m = _VERSION.match(text.strip().lower())
    if not m:
        raise KvwatchError(f"vLLM version {text[:40]!r}: expected MAJOR.MINOR[.PATCH], e.g. 0.10.1")
    return VllmVersion((int(m[1]), int(m[2]), int(m[3] or 0)), text.strip())
