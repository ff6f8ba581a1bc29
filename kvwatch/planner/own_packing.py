"""Which models pack their own cache kinds into one block pool, and their packing (pure).

DeepSeek-V4 and V4.1 (planner/deepseek_v41.py), Step5 (planner/step5_sparse.py), GLM-5-Next
(planner/glm5_next.py), Qwen4-Exp (planner/qwen4_exp.py), Dots3 (planner/dots3_note.py) and Mistral Large 4
(planner/mistral_large4.py) each build caches kvwatch's layer rules do not place; make_plan reports their
packing through plan.py's `_packed_plan`.
"""
from __future__ import annotations

from dataclasses import replace

from kvwatch.planner import deepseek_v41, dots3_note, glm5_next, mistral_large4, qwen4_exp, step5_sparse
from kvwatch.planner.deepseek_v4 import Packing
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.mtp_draft import with_draft_weights
from kvwatch.values.versions import VllmVersion


def own_packing(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                version: VllmVersion | None) -> Packing | None:
    """The packing of a model with cache kinds of its own under this command; None for any other."""
    if geometry.deepseek_v4 is not None:
        return deepseek_v41.packing_for(geometry.deepseek_v4, settings, device, version)
    if geometry.step5 is not None:   # on one scope
        return step5_sparse.plan_packing(geometry.step5, settings, device, version, geometry.config_dtype)
    if geometry.glm5_next is not None:   # on one scope
        return glm5_next.plan_packing(geometry.glm5_next, settings, device, version, geometry.config_dtype)
    if geometry.qwen4_exp is not None:   # on one scope
        return qwen4_exp.plan_packing(geometry.qwen4_exp, settings, device, version, geometry.config_dtype)
    if geometry.dots3_note is not None:   # on one scope
        return dots3_note.plan_packing(geometry.dots3_note, settings, device, version, geometry.config_dtype)
    if geometry.mistral_large4 is not None:   # on one scope
        return mistral_large4.plan_packing(geometry.mistral_large4, settings, device, version, geometry.config_dtype)
    return None


def with_packed_draft(geometry: ModelGeometry, kv: Packing) -> ModelGeometry:
    """The geometry whose weights hold the MTP draft's (planner/packed_draft.py) where the packing plans
    the draft's layers: they load beside the target's and come out of the KV cache's memory."""
    if not kv.drafted:
        return geometry
    return replace(geometry, weight_count=with_draft_weights(geometry.weight_count, geometry.packed_draft))
