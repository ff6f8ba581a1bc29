"""Learned memory profiles shared by a fleet: one JSON file per profile in a directory many hosts mount
(a ReadWriteMany volume, the model cache volume, a host path), so what one host's engine measured
plans every identical host's first launch exactly.

- **One file per profile**: `<profile key>-rank<R>.json`, the key of planner/gpu_budget.profile_key (the
  model, the flags that change vLLM's profile run, the card and the vLLM release) and the rank.
- **No lock server**: each write is a whole new file renamed over the old one
  (state_store.write_atomic: a temporary file in the same directory, fsync, rename). Writers on
  different hosts race only on the rename: the last one wins, and every file a reader opens is
  whole. A reader validates what it reads all the same (a copy by hand, another program): a file
  that does not parse or does not hold for this launch is ignored, never trusted.
- **Provenance**: who measured it (host, time) and the engine's own figures (the budget it sized
  against and the KV memory its profile left).

A profile is used (usable(), pure) only for the same key, card (name and memory), vLLM release
and rank, and only when the GPU has free at least the budget the profile was measured under: vLLM
refuses to start with less free memory than that (docs/vllm-facts.md §6; vLLM 0.32.0,
vllm/v1/worker/utils.py:761), and a fuller GPU is not the start-up the figures describe. Otherwise the
host profiles as before.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvwatch.boundary.device_probe import installed_vllm
from kvwatch.diagnosis import GpuContext
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.values.json_text import parse_json
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.watchdog import disk_writer
from kvwatch.watchdog.preflight import learned_key
from kvwatch.watchdog.state_store import read_regular, write_atomic

_LOG = logging.getLogger(__name__)
SCHEMA = 1
MAX_PROFILE_BYTES = 16 * 1024
_KEY = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class SharedProfile:
    key: str                       # gpu_budget.profile_key
    rank: int
    card: str                      # the device name NVML reports
    card_memory_bytes: int         # its total memory
    vllm_version: str
    requested_bytes: int           # the engine's budget: CUDA total x the utilization it took
    available_kv_bytes: int        # what its memory profile left the KV cache
    host: str
    written_at: float              # wall clock, seconds

    @property
    def non_kv_bytes(self) -> int:
        return max(0, self.requested_bytes - self.available_kv_bytes)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self), "non_kv_bytes": self.non_kv_bytes}

    @classmethod
    def from_json(cls, data: object) -> SharedProfile:
        """From to_json()'s form; ValueError for anything else (a wrong type, a missing field)."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a schema-{SCHEMA} profile")
        ints = ("rank", "card_memory_bytes", "requested_bytes", "available_kv_bytes")
        strings = ("key", "card", "vllm_version", "host")
        for name in ints:
            if not isinstance(data.get(name), int) or isinstance(data.get(name), bool) or data[name] < 0:
                raise ValueError(f"{name}: not a whole number >= 0")
        for name in strings:
            if not isinstance(data.get(name), str) or not data[name]:
                raise ValueError(f"{name}: not a string")
        written = data.get("written_at")
        if isinstance(written, bool) or not isinstance(written, (int, float)) or not math.isfinite(written):
            raise ValueError("written_at: not a time")
        if not _KEY.match(data["key"]):
            raise ValueError("key: not a profile key")
        if data["available_kv_bytes"] > data["requested_bytes"]:
            raise ValueError("available_kv_bytes above requested_bytes")
        return cls(**{name: data[name] for name in (*ints, *strings)}, written_at=float(written))


@dataclass(frozen=True)
class Launch:
    """What this launch is: the profile it needs, on which card and vLLM, and the GPU's free memory now."""

    key: str
    rank: int
    card: str
    card_memory_bytes: int
    vllm_version: str
    free_bytes: int | None         # NVML's free memory of the GPU now; None when unknown


def usable(profile: SharedProfile, launch: Launch) -> str | None:
    """None when the profile holds for this launch, else why not (pure)."""
    for name in ("key", "rank", "card", "card_memory_bytes", "vllm_version"):
        theirs, ours = getattr(profile, name), getattr(launch, name)
        if theirs != ours:
            return f"measured with {name} {theirs!r}, this launch has {ours!r}"
    if launch.free_bytes is None:
        return "the GPU's free memory is unknown: vLLM's own start-up check cannot be foreseen"
    if launch.free_bytes < profile.requested_bytes:
        return (f"the GPU has {launch.free_bytes} bytes free, less than the {profile.requested_bytes} "
                "the profile was measured with")
    return None


def file_name(key: str, rank: int) -> str:
    if not _KEY.match(key):
        raise ValueError(f"not a profile key: {key!r}")
    return f"{key}-rank{rank}.json"


def read(directory: str | os.PathLike[str], key: str, rank: int = 0) -> SharedProfile | None:
    """The profile stored for (key, rank), or None when there is none or it is not valid (logged)."""
    path = Path(directory) / file_name(key, rank)
    try:
        profile = SharedProfile.from_json(parse_json(read_regular(path, MAX_PROFILE_BYTES).decode("utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        _LOG.warning("learned_dir: ignoring %s: %s", path, exc)
        return None
    if (profile.key, profile.rank) != (key, rank):
        _LOG.warning("learned_dir: ignoring %s: it holds profile %s rank %d", path, profile.key, profile.rank)
        return None
    return profile


def write(directory: str | os.PathLike[str], profile: SharedProfile) -> Path:
    """Store the profile atomically (the last writer wins); OSError when the directory is not writable."""
    path = Path(directory) / file_name(profile.key, profile.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, _encoded(profile))
    return path


def _encoded(profile: SharedProfile) -> bytes:
    return (json.dumps(profile.to_json(), sort_keys=True) + "\n").encode()


def launch_of(command: EngineCommand, device: Device | None, free_bytes: int | None = None,
              rank: int = 0) -> Launch | None:
    """This launch's profile, card and vLLM; None where nothing is learned (no CUDA GPU, a command
    the planner cannot read)."""
    if device is None or device.platform != "cuda" or not device.total_memory_bytes:
        return None
    key = learned_key(command, device)
    if key is None:
        return None
    return Launch(key, rank, device.name, device.total_memory_bytes, str(installed_vllm() or DEFAULT_RELEASE), free_bytes)


def adopt(directory: str, launch: Launch | None) -> int | None:
    """The non-KV bytes another host measured for this launch, when its profile holds here (logged
    either way); None otherwise."""
    if not directory or launch is None:
        return None
    profile = read(directory, launch.key, launch.rank)
    if profile is None:
        _LOG.info("learned_dir: no profile %s yet in %s: this host profiles", launch.key, directory)
        return None
    why = usable(profile, launch)
    if why is not None:
        _LOG.info("learned_dir: profile %s from %s not used: %s", launch.key, profile.host, why)
        return None
    _LOG.info("learned_dir: planning with profile %s measured on %s at %s (non-KV %d bytes)", launch.key,
              profile.host, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(profile.written_at)), profile.non_kv_bytes)
    return profile.non_kv_bytes


def adopt_into(learned: dict[str, int], directory: str, command: EngineCommand, device: Device | None,
               gpu: GpuContext | None) -> None:
    """Add the shared profile of this launch to the host's own learned figures, unless it has one."""
    launch = launch_of(command, device, gpu.free_bytes if gpu is not None else None)
    if launch is None or launch.key in learned:
        return
    non_kv = adopt(directory, launch)
    if non_kv is not None:
        learned[launch.key] = non_kv


def publish(directory: str, command: EngineCommand, device: Device | None, requested_bytes: int,
            available_kv_bytes: int) -> None:
    """Share what this host's engine measured; a failure to write is logged, never fatal."""
    launch = launch_of(command, device)
    if not directory or launch is None:
        return
    profile = SharedProfile(launch.key, launch.rank, launch.card, launch.card_memory_bytes, launch.vllm_version,
                            requested_bytes, min(available_kv_bytes, requested_bytes), socket.gethostname(),
                            time.time())
    # Off the watchdog's thread: a learned_dir on a hung network volume must not hold it (the
    # writer says once when a write fails, and retries).
    path = Path(directory) / file_name(profile.key, profile.rank)
    disk_writer.learned().put(path, _encoded(profile))
    _LOG.info("learned_dir: sharing profile %s as %s", launch.key, path)
