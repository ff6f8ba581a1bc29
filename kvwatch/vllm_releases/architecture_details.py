"""Details of the architectures table per release (pure): the cache classes behind each kind, the
state dtype rules, the transformers model types and config-class defaults, expanded from the
generated table's changes (generated/architecture_details.py). Not read on the plan path."""
from __future__ import annotations

from typing import Any

from kvwatch.vllm_releases.generated.architecture_details import BASE, BASE_RELEASE, CHANGES
from kvwatch.vllm_releases.release_chain import expand

DETAILS: dict[str, dict[str, dict[str, Any]]] = {
    release: dict(sorted(table.items())) for release, table in expand(BASE_RELEASE, BASE, CHANGES).items()}
