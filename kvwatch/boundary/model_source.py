"""Find and read a model's config.json: a local directory or the HF cache, never the network.

Where vLLM reads a Mistral-format params.json instead (consolidated*.safetensors beside it: vLLM 0.34.0
transformers_utils/config.py:934-943), kvwatch reads it too for the models it translates, as the
config vLLM builds from it: Mistral Large 4 (planner/mistral_large4.py, also where there is no
config.json) and Voxtral (planner/voxtral.py params_config); any other params.json is left for
config.json, as before."""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kvwatch.boundary.bounded_read import FileTooLarge, NotRegularFile, open_regular, read_bounded
from kvwatch.errors import ConfigError
from kvwatch.planner.mistral_large4 import hf_config, is_large4_params
from kvwatch.planner.pooling_run import sentence_transformers_pooling
from kvwatch.planner.voxtral import is_audio_params, params_config
from kvwatch.vllm_releases.weight_files import HF_PATTERNS, index_name, index_weight_files, loaded_files


@dataclass(frozen=True)
class ModelSource:
    path: Path                 # the directory that holds config.json
    config: dict

    @functools.cached_property
    def _tensors(self) -> tuple[int, int] | None:
        return _weights_bytes(self.path)

    @property
    def weights_bytes(self) -> int | None:
        """The tensors vLLM loads from the weight files, when they are there. Read on first use
        (their headers): the exporter reads a model only for its config."""
        return self._tensors[0] if self._tensors is not None else None

    @property
    def lm_head_file_bytes(self) -> int:
        """The LM head tensors among them (`lm_head.weight`), which a model vLLM converts to pooling
        never allocates (planner/pooling_run.py); 0 without weight files."""
        return self._tensors[1] if self._tensors is not None else 0

    @functools.cached_property
    def sentence_transformers_pooling(self) -> bool:
        """Whether modules.json beside config.json names a Sentence Transformers Pooling module, which
        makes vLLM serve the model with its pooling runner (planner/pooling_run.py). Read on first use."""
        try:
            modules = json.loads(read_bounded(self.path / "modules.json", MAX_CONFIG_BYTES).decode("utf-8"))
        except (OSError, FileTooLarge, NotRegularFile, UnicodeDecodeError, ValueError, RecursionError):
            return False
        return sentence_transformers_pooling(modules)


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
            try:
                name = read_bounded(ref, MAX_REF_BYTES).decode("utf-8", "replace").strip()
            except (OSError, ValueError):
                name = ""   # an odd ref: the newest snapshot below, as when there is none
            snapshot = repo_dir / "snapshots" / name
            if name and "/" not in name and any((snapshot / f).is_file() for f in CONFIG_FILES):
                return snapshot
        snapshots = sorted(p for f in CONFIG_FILES for p in (repo_dir / "snapshots").glob(f"*/{f}")) \
            if repo_dir.is_dir() else []
        if snapshots:
            return snapshots[-1].parent
    return None


CONFIG_FILES = ("config.json", "params.json")
MAX_REF_BYTES = 4096                  # refs/main holds one commit hash
MAX_INDEX_BYTES = 64 << 20            # an index maps tensor names to files: some MB for the largest models
MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors format's own limit on its JSON header


def _weights_bytes(directory: Path) -> tuple[int, int] | None:
    """The bytes of the tensors vLLM's loader reads from this directory (vllm_releases/weight_files):
    each safetensors file's tensors from its header, other files by their size; and of those the LM
    head's (safetensors only); None without weights."""
    names = [p.name for pattern in HF_PATTERNS for p in directory.glob(pattern)]
    files = loaded_files(names, _index_files(directory / index_name(names)))
    if not files:
        return None
    sizes = [_tensor_bytes(directory / name) for name in files]
    return sum(total for total, _ in sizes), sum(head for _, head in sizes)


def _index_files(path: Path) -> list[str] | None:
    try:
        if not path.is_file():
            return None
        return index_weight_files(json.loads(read_bounded(path, MAX_INDEX_BYTES).decode("utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None   # an unreadable index: vLLM would refuse it; the plan counts every file


def _is_lm_head(name: str) -> bool:
    return name == "lm_head.weight" or name.endswith(".lm_head.weight")


def _tensor_bytes(path: Path) -> tuple[int, int]:
    """A safetensors file's tensor bytes (its header's data_offsets), else the file's size (stat
    follows the HF cache's blob links); a header that does not parse counts as the file. Second:
    the bytes of its LM head tensors."""
    size = path.stat().st_size
    if path.suffix != ".safetensors":
        return size, 0
    try:
        with open_regular(path) as (f, _):
            length = int.from_bytes(f.read(8), "little")
            if not 0 < length <= min(MAX_SAFETENSORS_HEADER, size - 8):
                return size, 0
            header = json.loads(f.read(length))
        spans = {k: int(t["data_offsets"][1]) - int(t["data_offsets"][0]) for k, t in header.items() if k != "__metadata__"}
        total = sum(spans.values())
        if not 0 <= total <= size:
            return size, 0
        return total, sum(n for k, n in spans.items() if _is_lm_head(k))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, TypeError, KeyError, AttributeError, IndexError):
        return size, 0


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
    if candidate.name.endswith(".json") and candidate.exists() and not candidate.is_dir():   # the reader says what else it is
        directory, config_path = candidate.parent, candidate
    elif candidate.is_dir():
        directory, config_path = candidate, candidate / "config.json"
    else:
        snapshot = _snapshot_dir(model) if model.count("/") == 1 and not model.startswith(("/", ".")) else None
        if snapshot is None:
            raise ConfigError(f"model {model!r}: no such directory, and not in the local Hugging Face cache")
        directory, config_path = snapshot, snapshot / "config.json"
    if (mistral := _mistral_format(directory, config_path)) is not None:
        return ModelSource(path=directory, config=mistral)
    if not config_path.exists():
        raise ConfigError(f"{directory}: no config.json")
    return ModelSource(path=directory, config=_read_json(config_path))


def _mistral_format(directory: Path, config_path: Path) -> dict | None:
    """The config vLLM builds from a Mistral-format params.json where vLLM reads one in place of config.json:
    consolidated*.safetensors beside it (transformers_utils/repo_utils.py is_mistral_model_repo), or, for
    Mistral Large 4, no config.json at all; None for a model kvwatch does not translate."""
    params_path = directory / "params.json"
    if config_path.name not in ("config.json", "params.json") or not params_path.is_file():
        return None
    consolidated = any(directory.glob("consolidated*.safetensors"))
    if config_path.name == "config.json" and config_path.exists() and not consolidated:
        return None
    params = _read_json(params_path)
    if is_large4_params(params):
        return hf_config(params, _hf_max_positions(directory / "config.json"))
    if consolidated and config_path.name == "config.json" and is_audio_params(params):
        return params_config(params, _hf_max_positions(config_path))
    return None


def _hf_max_positions(config_path: Path) -> int | None:
    """The HF config.json's text max_position_embeddings, which vLLM takes for a params.json that has
    none (planner/voxtral.py DEFAULT_MAX_POSITIONS); None where there is no readable one."""
    try:
        config = _read_json(config_path) if config_path.is_file() else {}
    except ConfigError:
        return None
    text = config.get("text_config")
    value = (text if isinstance(text, dict) else config).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _read_json(config_path: Path) -> dict:
    try:
        config = json.loads(read_bounded(config_path, MAX_CONFIG_BYTES).decode("utf-8"))
    except FileTooLarge as exc:
        raise ConfigError(f"{config_path}: {exc}: not a model config") from None
    except NotRegularFile as exc:
        raise ConfigError(f"{config_path}: {exc}: a model config is a regular file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config_path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_path}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(f"{config_path}: nested too deeply to be a model config") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path}: expected a JSON object")
    return config
