"""Text from an engine, a log or a state file, made safe to print on an operator's terminal."""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Escape sequences (OSC, CSI), BEL and CR shown as \\xNN, not obeyed; newlines and tabs kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
