"""vLLM's CUDA attention backend priorities per release (pure), expanded from the generated table's
changes (generated/backend_priorities.py, scripts/gen_backend_priorities.py): per release,
(attention, capability major) -> (vLLM's order, the source line of the `return` that gives it); the
`None` major answers for every major not listed."""
from __future__ import annotations

from kvwatch.vllm_releases.generated.backend_priorities import BASE, BASE_RELEASE, CHANGES, Order
from kvwatch.vllm_releases.release_chain import expand

CUDA_PRIORITIES: dict[str, dict[tuple[str, int | None], Order]] = expand(BASE_RELEASE, BASE, CHANGES)
