"""A start stuck on Ray's placement group (kvwatch/diagnosis/placement_wait.py): named from the waits
that repeat with nothing after them, whatever their level, with the fix from the GPUs Ray sees."""
from __future__ import annotations

import pytest

from kvwatch.diagnosis import FailureKind, diagnose
from kvwatch.diagnosis.placement_wait import fix_for

# vLLM's wording (executor/ray_utils.py _wait_until_pg_ready), at INFO in some releases and WARNING in others.
WAIT = ("(EngineCore_DP0 pid=300) {level} 12-05 10:00:{i:02d} [ray_utils.py:330] Waiting for creating a placement "
        "group of specs for {s} seconds. specs=[{{'GPU': 1.0, 'node:10.0.0.1': 0.001}}, {{'GPU': 1.0}}]. Check `ray "
        "status` and `ray list nodes` to see if you have enough resources, and make sure the IP addresses used by "
        "ray cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are running "
        "on a multi-node.")
START = "(APIServer pid=1) INFO 12-05 10:00:00 [api_server.py:1] vLLM API server version 0.20.0"


def waits(*seconds: int, level: str = "INFO") -> list[str]:
    return [WAIT.format(level=level, i=i, s=s) for i, s in enumerate(seconds)]


@pytest.mark.parametrize("log, kind", [
    ([START, *waits(10, 30, 70)], FailureKind.PLACEMENT_GROUP_UNAVAILABLE),
    ([START, *waits(10, 30, 70, level="WARNING")], FailureKind.PLACEMENT_GROUP_UNAVAILABLE),
    ([START, *waits(10)], FailureKind.UNKNOWN),                  # one wait: a slow start, not yet stuck
    ([START, *waits(10, 30), "(EngineCore_DP0 pid=300) (RayWorkerWrapper pid=400) INFO 12-05 10:01:00 "
      "[gpu_model_runner.py:1] Starting to load model x"], FailureKind.UNKNOWN),    # it went on
    ([START, *waits(10, 30), "(APIServer pid=1) INFO 12-05 10:02:00 [launcher.py:1] Application startup complete."],
     FailureKind.ENGINE_DIED),                                 # it served: a death, as any log that ends so
])
def test_the_waits_name_the_class_only_when_nothing_came_after_them(log, kind):
    d = diagnose(log)
    assert d.kind is kind, d
    if kind is FailureKind.PLACEMENT_GROUP_UNAVAILABLE:
        assert d.fatal and d.facts["placement_group_waits"] == 3 and d.facts["waited_s"] == 70
        assert d.facts["gpus"] == 2.0 and "Waiting for creating a placement group" in (d.evidence or "")


def test_an_exception_after_the_waits_is_the_root_cause():
    oom = "(EngineCore_DP0 pid=300) ERROR 12-05 10:03:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory."
    assert diagnose([START, *waits(10, 30), oom]).kind is FailureKind.CUDA_OOM


def test_a_new_run_forgets_the_waits_of_the_one_before():
    rerun = "(APIServer pid=2) INFO 12-05 11:00:00 [utils.py:1] non-default args: {'model': 'x'}"
    assert diagnose([START, *waits(10, 30), rerun]).kind is FailureKind.UNKNOWN


def test_the_gpus_ray_sees_give_the_fix():
    d = diagnose([START, *waits(10, 30), "Resources", " 0.0/1.0 GPU"])
    assert d.facts["ray_gpus"] == 1.0 and d.facts["gpus"] == 2.0
    assert "Ray sees 1 GPU(s), the engine asks for 2" in d.facts["help"]


@pytest.mark.parametrize("asked, seen, says", [
    (4.0, 2.0, "Ray sees 2 GPU(s), the engine asks for 4"),
    (8.0, None, "Ray never found the 8 GPU(s)"),
    (None, None, "Ray never found the GPUs the engine asks for"),
    (2.5, 1.0, "asks for 2.5"),
])
def test_fix_for(asked, seen, says):
    assert says in fix_for(asked, seen)
