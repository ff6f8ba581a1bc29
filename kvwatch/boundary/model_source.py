"""Find and read a model's config.json: a local directory or the HF cache, never the network."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from kvwatch.errors import ConfigError


@dataclass(frozen=True)
class ModelSource:
    path: Path                 # the directory that holds config.json
    config: dict
    weights_bytes: int | None  # sum of the weight files' sizes, when they are there


def _hf_cache_dirs() -> list[Path]:
    # Same precedence as huggingface_hub: HF_HUB_CACHE, then HF_HOME/hub, then ~/.cache.
    if os.environ.get("HF_HUB_CACHE"):
        return [Path(os.environ["HF_HUB_CACHE"])]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    return [Path(home) / "hub"]


def _snapshot_dir(repo_id: str) -> Path | None:
    for cache in _hf_cache_dirs():
        repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
        ref = repo_dir / "refs" / "main"
        if ref.is_file():
            snapshot = repo_dir / "snapshots" / ref.read_text().strip()
            if (snapshot / "config.json").is_file():
                return snapshot
        snapshots = sorted((repo_dir / "snapshots").glob("*/config.json")) if repo_dir.is_dir() else []
        if snapshots:
            return snapshots[-1].parent
    return None


def _weights_bytes(directory: Path) -> int | None:
    files = [p for pattern in ("*.safetensors", "*.bin", "*.pt") for p in directory.glob(pattern)]
    if not files:
        return None
    return sum(p.stat().st_size for p in files)  # stat follows the HF cache's blob links


MAX_CONFIG_BYTES = 16 << 20   # a config.json is a few KB; a multimodal one under a MB
MAX_MODEL_CHARS = 1024


def load_model_source(model: str) -> ModelSource:
    """Read MODEL's config.json from a directory, a config.json path, or the local HF cache."""
    if len(model) > MAX_MODEL_CHARS or "\0" in model:
        raise ConfigError(f"model {model[:60]!r}...: not a model directory or name")
    try:
        return _load(model)
    except OSError as exc:   # a name too long, a loop of links, a directory we may not read
        raise ConfigError(f"model {model[:200]!r}: {exc.strerror or exc}") from None


def _load(model: str) -> ModelSource:
    candidate = Path(model).expanduser()
    if candidate.is_file() and candidate.name.endswith(".json"):
        directory, config_path = candidate.parent, candidate
    elif candidate.is_dir():
        directory, config_path = candidate, candidate / "config.json"
    else:
        snapshot = _snapshot_dir(model) if model.count("/") == 1 and not model.startswith(("/", ".")) else None
        if snapshot is None:
            raise ConfigError(f"model {model!r}: no such directory, and not in the local Hugging Face cache")
        directory, config_path = snapshot, snapshot / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{directory}: no config.json")
    try:
        with open(config_path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{config_path}: larger than {MAX_CONFIG_BYTES >> 20} MiB: not a model config")
        config = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config_path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_path}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(f"{config_path}: nested too deeply to be a model config") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path}: expected a JSON object")
    return ModelSource(path=directory, config=config, weights_bytes=_weights_bytes(directory))
