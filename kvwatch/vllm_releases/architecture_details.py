"""Details of the architectures table per release (pure): the cache classes behind each kind, the
state dtype rules, the transformers model types and config-class defaults, expanded from the
generated table's changes (generated/architecture_details.py). Not read on the plan path."""
from __future__ import annotations

from typing import Any

from kvwatch.vllm_releases.generated.architecture_details import BASE, BASE_RELEASE, CHANGES


def _expand() -> dict[str, dict[str, dict[str, Any]]]:
    out = {BASE_RELEASE: dict(BASE)}
    current = dict(BASE)
    for release, (changed, dropped) in CHANGES.items():
        current = {k: v for k, v in current.items() if k not in dropped} | changed
        out[release] = dict(sorted(current.items()))
    return out


DETAILS: dict[str, dict[str, dict[str, Any]]] = _expand()
