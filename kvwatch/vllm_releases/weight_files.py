"""Which weight files of a local checkpoint vLLM's default loader reads (pure).

vLLM 0.32.0, vllm/model_executor/model_loader/default_loader.py:168-259 (`_prepare_weights`, load
format "auto") and weight_utils.py:585-629:
- any `consolidated*.safetensors` makes the format "mistral": those files only, filtered by
  `consolidated.safetensors.index.json`;
- else the first of `*.safetensors`, `*.bin` (then `*.pt`) that matches anything;
- safetensors files are kept only where the index (`model.safetensors.index.json`) names them, when
  there is one (a repository that ships sharded and consolidated copies loads one);
- `.bin`/`.pt` files lose the trainer's leftovers (training_args.bin, optimizer.bin, ...).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatch

SAFE_INDEX = "model.safetensors.index.json"
MISTRAL_INDEX = "consolidated.safetensors.index.json"
MISTRAL_PATTERN = "consolidated*.safetensors"
HF_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
NOT_FOR_INFERENCE = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")


def _mistral(names: Iterable[str]) -> bool:
    """Load format "auto" is "mistral" where any consolidated safetensors file is present."""
    return any(fnmatch(n, MISTRAL_PATTERN) for n in names)


def index_name(names: Iterable[str]) -> str:
    """The index file vLLM filters the safetensors by, for this directory's file names."""
    return MISTRAL_INDEX if _mistral(names) else SAFE_INDEX


def loaded_files(names: Iterable[str], index_files: Iterable[str] | None) -> list[str]:
    """The weight files (names in one directory) vLLM loads; `index_files`: the file names the
    index's weight_map names (None: no index, or none readable)."""
    names = sorted(set(names))
    patterns = (MISTRAL_PATTERN,) if _mistral(names) else HF_PATTERNS
    chosen: list[str] = []
    for pattern in patterns:
        chosen = [n for n in names if fnmatch(n, pattern)]
        if chosen:
            break
    if chosen and chosen[0].endswith(".safetensors"):
        if index_files is not None:
            listed = set(index_files)
            chosen = [n for n in chosen if n in listed]
        return chosen
    return [n for n in chosen if not any(n.endswith(x) for x in NOT_FOR_INFERENCE)]


def index_weight_files(index: object) -> list[str] | None:
    """The file names a parsed index JSON's weight_map names, else None (not an index)."""
    weight_map = index.get("weight_map") if isinstance(index, Mapping) else None
    if not isinstance(weight_map, Mapping):
        return None
    return sorted({v for v in weight_map.values() if isinstance(v, str)})
