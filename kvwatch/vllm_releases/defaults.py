"""vLLM's defaults, release by release (pure), expanded from the generated table's changes
(generated/defaults.py, scripts/gen_release_defaults.py). The types are in defaults_shape.py, the
lookups in release_defaults.py."""
from __future__ import annotations

from kvwatch.vllm_releases.defaults_shape import ReleaseDefaults
from kvwatch.vllm_releases.generated.defaults import BASE, BASE_RELEASE, CHANGES
from kvwatch.vllm_releases.release_chain import expand_fields

DEFAULTS: dict[str, ReleaseDefaults] = {
    release: ReleaseDefaults(**fields)   # type: ignore[arg-type]
    for release, fields in expand_fields(BASE_RELEASE, BASE, CHANGES).items()}
