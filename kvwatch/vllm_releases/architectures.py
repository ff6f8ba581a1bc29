"""The KV cache layers vLLM builds for every architecture it registers, per release (pure): the
generated table (generated/architectures.py, scripts/gen_vllm_architectures.py) expanded from its
changes release by release. How kvwatch handles each kind is in kvwatch/planner/architecture_kinds.py."""
from __future__ import annotations

from kvwatch.vllm_releases.architecture_entry import ArchitectureEntry
from kvwatch.vllm_releases.generated.architectures import BASE, BASE_RELEASE, CHANGES


def _expand() -> dict[str, dict[str, ArchitectureEntry]]:
    out = {BASE_RELEASE: dict(BASE)}
    current = dict(BASE)
    for release, (changed, dropped) in CHANGES.items():
        current = {k: v for k, v in current.items() if k not in dropped} | changed
        out[release] = dict(sorted(current.items()))
    return out


ARCHITECTURES: dict[str, dict[str, ArchitectureEntry]] = _expand()
