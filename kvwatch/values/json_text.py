"""JSON given on a command line or in a small file, parsed (pure): one error type for every malformed text.

json.loads parses nested arrays and objects by recursion, so a text of a few thousand brackets raises
RecursionError, not ValueError: every `except ValueError` around it let a traceback through.
"""
from __future__ import annotations

import json


def parse_json(text: str) -> object:
    """`text` as JSON; ValueError (json's JSONDecodeError, or one for nesting too deep) when it is not."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
