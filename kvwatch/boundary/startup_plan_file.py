"""Read one of vLLM's persisted start-up plans (vllm_releases/startup_plan.py says what it holds)."""
from __future__ import annotations

import logging

from kvwatch.boundary.bounded_read import read_bounded
from kvwatch.vllm_releases.startup_plan import MAX_PLAN_BYTES, PersistedPlan, parse_plan_file

_LOG = logging.getLogger(__name__)


def read_persisted_plan(path: str | None, schema: int = 1) -> PersistedPlan | None:
    """The plan at `path` (as the engine's "Saved startup plan to" line named it); None when there is
    none or vLLM would not apply it. `schema`: the one the engine's release writes
    (ReleaseDefaults.startup_plan_schema: 2 from 0.34, vLLM 0.34.0, vllm/v1/worker/startup_plan.py:39).
    Never through a symlink, never blocking on a FIFO."""
    if not path:
        return None
    try:
        data = read_bounded(path, MAX_PLAN_BYTES, follow_symlinks=False)
    except (OSError, ValueError) as exc:
        _LOG.debug("startup plan %s: %s", path, getattr(exc, "strerror", None) or exc)
        return None
    try:
        return parse_plan_file(data, schema)
    except ValueError as exc:
        _LOG.info("startup plan %s: ignored: %s", path, exc)
        return None
