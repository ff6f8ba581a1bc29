"""The KV cache layers vLLM builds for every architecture it registers, per release (pure): the
generated table (generated/architectures.py, scripts/gen_vllm_architectures.py) expanded from its
changes release by release. How kvwatch handles each kind is in kvwatch/planner/architecture_kinds.py."""
from __future__ import annotations

from kvwatch.vllm_releases.architecture_entry import ArchitectureEntry
from kvwatch.vllm_releases.generated.architectures import BASE, BASE_RELEASE, CHANGES
from kvwatch.vllm_releases.release_chain import expand

ARCHITECTURES: dict[str, dict[str, ArchitectureEntry]] = {
    release: dict(sorted(table.items())) for release, table in expand(BASE_RELEASE, BASE, CHANGES).items()}
