"""One architecture of a vLLM release, as scripts/gen_vllm_architectures.py reads it (pure)."""
from __future__ import annotations

from typing import NamedTuple


class ArchitectureEntry(NamedTuple):
    group: str                    # registry group ("text_generation", ...; "previously_supported")
    source: str                   # the model file, relative to the release ("vllm/model_executor/models/x.py")
    cls: str                      # the class vLLM loads for it ("" when dropped)
    kinds: tuple[str, ...]        # cache classes or Mamba backends its classes can build
    features: tuple[str, ...]     # attention variants and interfaces (sliding_window, kv_sharing, hybrid, ...)
    spec_classes: tuple[str, ...]  # "KIND:Class" whose get_kv_cache_spec a Mamba kind runs
    backend: str                  # "transformers" when vLLM runs it on its Transformers backend, else ""
    last_release: str             # a dropped architecture: the last release that served it, else ""
