"""Reading config.json's numbers as the planner needs them (pure): a value of the wrong type, a
boolean, zero, a negative, NaN or an infinity is no size, whatever key it sits under."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def positive_int(cfg: Mapping[str, Any], *keys: str) -> int:
    """The first of `keys` whose value is a positive whole number (JSON booleans are not), else 0."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def positive_number(value: Any) -> float:
    """`value` as a finite positive number, else 0.0 (json.loads reads NaN and Infinity as floats)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value):
        return float(value)
    return 0.0
