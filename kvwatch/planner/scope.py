"""Where kvwatch's rules hold: only for an architecture kvwatch can classify (pure).

Every rule behind a predicted refusal (planner/rules.py kernel limits, backend_legality.py,
config_refusals.py, architectures.py, the KV and Mamba cache checks of plan.py) was read from vLLM
for the layer kinds kvwatch plans. For a model that builds a layer kind kvwatch has no rule for
(the plan's source is "unknown": architecture_kinds.unknown_reasons), kvwatch does not know which
attention backend, kernel or cache vLLM builds, so no rule may claim a certain failure and none may
change the command: preflight then launches it as given, and a remedy after a crash does not take
a fix from figures kvwatch could not compute. Issue 39: DeepSeek-V4-Flash (fp8 KV, TP 2, SM 12.0)
served, while the TRITON_MLA fp8 kernel limit, read for DeepSeek-V2/V3's MLA, would have rewritten
its --kv-cache-dtype.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvwatch.planner.flag_change import NO_CHANGE
from kvwatch.planner.predicted_refusal import PredictedRefusal

NOT_APPLIED = "not applied: kvwatch cannot classify this architecture, so the rule is not known to hold for it"


def within_scope(warnings: Sequence[PredictedRefusal], unknown: Sequence[str]) -> tuple[PredictedRefusal, ...]:
    """The warnings as they stand for a model kvwatch classifies; for one it cannot (`unknown`: the
    reasons), each a risk only, with no flag change, and saying why."""
    if not unknown:
        return tuple(warnings)
    return tuple(replace(w, certain=False, fix=NO_CHANGE,
                         message=f"{w.message} ({NOT_APPLIED}" +
                                 (f"; it would have changed {w.fix.describe()})" if not w.fix.empty else ")"))
                 for w in warnings)
