"""kvwatch: KV-cache planner, Prometheus exporter and watchdog for vLLM."""
from __future__ import annotations

__version__ = "0.1.0"
