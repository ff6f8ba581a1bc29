"""Read one of vLLM's persisted start-up plans (vllm_releases/startup_plan.py says what it holds)."""
from __future__ import annotations

import logging
import os
import stat

from kvwatch.vllm_releases.startup_plan import MAX_PLAN_BYTES, PersistedPlan, parse_plan_file

_LOG = logging.getLogger(__name__)


def read_persisted_plan(path: str | None) -> PersistedPlan | None:
    """The plan at `path` (as the engine's "Saved startup plan to" line named it); None when there is
    none or vLLM would not apply it. Never through a symlink, never blocking on a FIFO."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        _LOG.debug("startup plan %s: %s", path, exc.strerror or exc)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_PLAN_BYTES + 1)
    except OSError as exc:
        _LOG.debug("startup plan %s: %s", path, exc.strerror or exc)
        return None
    finally:
        os.close(fd)
    try:
        return parse_plan_file(data)
    except ValueError as exc:
        _LOG.info("startup plan %s: ignored: %s", path, exc)
        return None
