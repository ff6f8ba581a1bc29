"""The kvwatch config file (TOML, schema in docs/config.md) as validated dataclasses.

Every error is one line naming the file and the key, raised as ConfigError (exit 2).
Unknown keys are errors: a misspelt `hang_timeout_second` silently keeping the default
would be worse than refusing to start. Every value is bounded (docs/config.md "Bounds"): the
file's size and nesting, each duration (an interval of 1e-300 s would spin a core), each count
and list.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.boundary.bounded_read import FileTooLarge, NotRegularFile, read_bounded
from kvwatch.errors import ConfigError
from kvwatch.listen import DEFAULT_LISTEN, parse_listen
from kvwatch.planner.serve_options import release_options
from kvwatch.policy import Policy
from kvwatch.vllm_releases import KNOWN
from kvwatch.watchdog.autopilot import Apply, AutopilotConfig, parse_window

DEFAULT_NAME = "vllm"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")  # the state file name: no slashes

MAX_CONFIG_BYTES = 1 << 20        # a config is a page; a 200 MB file is refused before it is parsed
MAX_LIST_ITEMS = 4096             # engine.command's words, engine.environment's variables
MAX_STRING_BYTES = 128 * 1024     # one word or value (Linux's MAX_ARG_STRLEN)
_MINUTE, _DAY = 60.0, 86400.0
# The range of each duration (seconds), where a value outside it can only be a mistake: below,
# a loop that spins (health checks every 1e-300 s) or a stop that never waits; above, a timer
# that never fires. The one table the file, the flags and docs/config.md "Bounds" follow.
SECONDS_BOUNDS: dict[str, tuple[float, float]] = {
    "engine.start_timeout_seconds": (1.0, 7 * _DAY),
    "engine.health_interval_seconds": (0.1, 60 * _MINUTE),
    "engine.hang_timeout_seconds": (1.0, _DAY),
    "engine.stall_timeout_seconds": (0.0, _DAY),   # 0: no stall detection
    "engine.pressure_window_seconds": (10.0, _DAY),
    "engine.stop_timeout_seconds": (1.0, 60 * _MINUTE),
    "policy.restart_window_seconds": (1.0, 7 * _DAY),
    "policy.backoff_initial_seconds": (0.05, _DAY),
    "policy.backoff_max_seconds": (0.05, _DAY),
    "policy.stable_seconds": (1.0, 7 * _DAY),
    "watch.interval_seconds": (0.1, 60 * _MINUTE),
    "autopilot.drain_timeout_seconds": (0.0, 60 * _MINUTE),   # 0: no wait for running requests
    "autopilot.measure_seconds": (10.0, _DAY),
}
MAX_CHANGES_PER_DAY = 24          # autopilot.max_changes_per_day: one an hour at most
MAX_COUNT = 1000                  # policy.max_corrections, policy.max_restarts


def bounded_seconds(value: float, where: str, key: str) -> float:
    """`value` if it lies within SECONDS_BOUNDS[key], else one ConfigError naming `where`."""
    low, high = SECONDS_BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"{where}: expected a finite number of seconds from {low:g} to {high:g}, got {value!r:.40}")
    return float(value)


@dataclass(frozen=True)
class EngineConfig:
    command: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    start_timeout_seconds: float = 1800.0
    health_interval_seconds: float = 5.0
    hang_timeout_seconds: float = 60.0
    stop_timeout_seconds: float = 60.0
    # Requests running and no token for this long, /health answering all the while: a stall
    # (watchdog/progress.py; docs/serving.md). Longer than the longest prefill on the card; 0: off.
    stall_timeout_seconds: float = 120.0
    # The window of the engine's own series a KV-pressure recommendation is judged on (docs/serving.md).
    pressure_window_seconds: float = 300.0
    # Launch with the KV memory an earlier launch of the same profile got (--kv-cache-memory-bytes),
    # less what other processes hold on the GPU then: a restart gets the same cache or fails fast.
    pin_kv_cache_memory: bool = False


@dataclass(frozen=True)
class WatchConfig:
    interval_seconds: float = 5.0
    all_gpus: bool = False      # export every GPU of the host, not only the engine's


@dataclass(frozen=True)
class Config:
    name: str = DEFAULT_NAME
    listen: str = DEFAULT_LISTEN
    state_dir: str = ""                  # "" until resolved: see default_state_dir()
    web_config: str | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    policy: Policy = field(default_factory=Policy)
    watch: WatchConfig = field(default_factory=WatchConfig)
    source: str = "<command line>"       # where it came from, for messages
    device: str = ""                     # "": kvwatch's choice; "cpu", "gpu" or a GPU index (NVML)
    learned_dir: str = ""                # "": none; a directory hosts share for learned profiles
    autopilot: AutopilotConfig = field(default_factory=AutopilotConfig)   # applying KV-pressure changes

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)


def default_state_dir(environ: Mapping[str, str] | None = None) -> str:
    """systemd's StateDirectory= when set, /var/lib/kvwatch for root, else the XDG state dir."""
    env = os.environ if environ is None else environ
    if env.get("STATE_DIRECTORY"):
        return env["STATE_DIRECTORY"].split(":")[0]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "/var/lib/kvwatch"
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "kvwatch")


def validate_name(name: str, where: str = "name") -> str:
    if not _NAME.match(name):
        raise ConfigError(f"{where} {name!r}: use letters, digits, '.', '_', '-', '@' (it names the state file)")
    return name


def load_config(path: str | os.PathLike[str]) -> Config:
    p = Path(path)
    try:
        data = tomllib.loads(read_bounded(p, MAX_CONFIG_BYTES).decode("utf-8"))
    except FileTooLarge as exc:
        raise ConfigError(f"config {p}: {exc}: not a kvwatch config") from None
    except NotRegularFile as exc:
        raise ConfigError(f"config {p}: {exc}: a config is a regular file") from None
    except OSError as exc:
        raise ConfigError(f"config {p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {p}: not UTF-8 text") from None
    except RecursionError:   # tomllib parses nested arrays and inline tables by recursion
        raise ConfigError(f"config {p}: nested too deeply") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {p}: not valid TOML: {exc}") from None
    return config_from_mapping(data, str(p))


def config_from_mapping(data: Mapping[str, Any], source: str = "<config>") -> Config:
    v = _Validator(source)
    v.no_unknown(data, "", ("name", "listen", "state_dir", "web_config", "device", "learned_dir", "engine", "policy",
                            "watch", "autopilot"))
    name = validate_name(v.string(data, "name", DEFAULT_NAME), f"config {source}: name")
    listen = v.string(data, "listen", DEFAULT_LISTEN)
    try:
        parse_listen(listen)
    except ConfigError as exc:
        raise ConfigError(f"config {source}: {exc}") from None
    state_dir = v.string(data, "state_dir", "")
    learned_dir = v.string(data, "learned_dir", "")
    web_config = data.get("web_config")
    if web_config is not None:
        web_config = v.string(data, "web_config", "")

    engine_data = v.table(data, "engine")
    v.no_unknown(engine_data, "engine.", [f.name for f in dataclasses.fields(EngineConfig)])
    command = v.string_list(engine_data, "engine.command")
    environment = v.string_map(engine_data, "engine.environment")
    engine = EngineConfig(
        command=tuple(command), environment=environment,
        start_timeout_seconds=v.seconds(engine_data, "engine.start_timeout_seconds", EngineConfig.start_timeout_seconds),
        health_interval_seconds=v.seconds(engine_data, "engine.health_interval_seconds", EngineConfig.health_interval_seconds),
        hang_timeout_seconds=v.seconds(engine_data, "engine.hang_timeout_seconds", EngineConfig.hang_timeout_seconds),
        stop_timeout_seconds=v.seconds(engine_data, "engine.stop_timeout_seconds", EngineConfig.stop_timeout_seconds),
        stall_timeout_seconds=v.seconds(engine_data, "engine.stall_timeout_seconds",
                                        EngineConfig.stall_timeout_seconds),
        pressure_window_seconds=v.seconds(engine_data, "engine.pressure_window_seconds",
                                          EngineConfig.pressure_window_seconds),
        pin_kv_cache_memory=v.boolean(engine_data, "engine.pin_kv_cache_memory", False),
    )

    policy_data = v.table(data, "policy")
    policy = _policy(v, policy_data)

    watch_data = v.table(data, "watch")
    v.no_unknown(watch_data, "watch.", ("interval_seconds", "all_gpus"))
    all_gpus = v.boolean(watch_data, "watch.all_gpus", False)
    watch = WatchConfig(interval_seconds=v.seconds(watch_data, "watch.interval_seconds", WatchConfig.interval_seconds), all_gpus=all_gpus)
    device = data.get("device", "")
    if isinstance(device, int) and not isinstance(device, bool):
        device = str(device)
    try:
        device = validate_device(device if isinstance(device, str) else repr(device), "device")
    except ConfigError as exc:
        raise ConfigError(f"config {source}: {exc}") from None
    autopilot = _autopilot(v, v.table(data, "autopilot"))
    return Config(name=name, listen=listen, state_dir=state_dir, web_config=web_config, engine=engine,
                  policy=policy, watch=watch, source=source, device=device, learned_dir=learned_dir,
                  autopilot=autopilot)


def _autopilot(v: _Validator, data: Mapping[str, Any]) -> AutopilotConfig:
    """[autopilot]: when kvwatch applies a KV-pressure recommendation by itself (docs/serving.md)."""
    v.no_unknown(data, "autopilot.", [f.name for f in dataclasses.fields(AutopilotConfig)])
    defaults = AutopilotConfig()
    modes = [m.value for m in Apply]
    raw = data.get("apply", defaults.apply.value)
    if raw not in modes:
        raise v.error("autopilot.apply", f"expected one of {', '.join(repr(m) for m in modes)}, got {raw!r:.40}")
    apply = Apply(raw)
    window = data.get("window")
    if window is not None:
        if not isinstance(window, str):
            raise v.error("autopilot.window", 'expected a string "HH:MM-HH:MM" (UTC)')
        try:
            parse_window(window)
        except ValueError as exc:
            raise v.error("autopilot.window", str(exc)) from None
        if apply is not Apply.WINDOW:
            raise v.error("autopilot.window", 'a window is used only with apply = "window"')
    elif apply is Apply.WINDOW:
        raise v.error("autopilot.window", 'apply = "window" needs a window, e.g. window = "02:00-04:00" (UTC)')
    per_day = data.get("max_changes_per_day", defaults.max_changes_per_day)
    if isinstance(per_day, bool) or not isinstance(per_day, int) or not 1 <= per_day <= MAX_CHANGES_PER_DAY:
        raise v.error("autopilot.max_changes_per_day", f"expected a whole number from 1 to {MAX_CHANGES_PER_DAY}")
    return AutopilotConfig(
        apply=apply, window=window,
        drain_timeout_seconds=v.seconds(data, "autopilot.drain_timeout_seconds", defaults.drain_timeout_seconds),
        measure_seconds=v.seconds(data, "autopilot.measure_seconds", defaults.measure_seconds),
        max_changes_per_day=per_day)


def validate_device(value: str, where: str) -> str:
    """"", "cpu", "gpu" or a GPU index: what kvwatch plans and watches the engine on."""
    if value in ("", "cpu", "gpu") or (value.isascii() and value.isdigit() and len(value) <= 4):
        return value
    raise ConfigError(f"{where} {value[:40]!r}: expected cpu, gpu or a GPU index")


def _policy(v: _Validator, data: Mapping[str, Any]) -> Policy:
    defaults = Policy()
    fields = {f.name: f for f in dataclasses.fields(Policy)}
    v.no_unknown(data, "policy.", fields)
    values: dict[str, Any] = {}
    for key, raw in data.items():
        default = getattr(defaults, key)
        where = f"policy.{key}"
        if key == "fixed_flags":
            values[key] = _fixed_flags(v, data, where)
        elif isinstance(default, bool):
            if not isinstance(raw, bool):
                raise v.error(where, "expected true or false")
            values[key] = raw
        elif isinstance(default, int):
            if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_COUNT:
                raise v.error(where, f"expected a whole number from 0 to {MAX_COUNT}")
            values[key] = raw
        elif where in SECONDS_BOUNDS:
            values[key] = v.seconds(data, where, float(default), key=key)
        else:
            values[key] = v.positive(data, where, float(default), key=key)
    policy = dataclasses.replace(defaults, **values)
    if policy.backoff_initial_seconds > policy.backoff_max_seconds:
        raise v.error("policy.backoff_initial_seconds", "larger than policy.backoff_max_seconds")
    if not 0 < policy.min_gpu_memory_utilization <= policy.max_gpu_memory_utilization <= 1:
        raise v.error("policy.max_gpu_memory_utilization",
                      "need 0 < min_gpu_memory_utilization <= max_gpu_memory_utilization <= 1")
    if not 0.001 <= policy.gpu_memory_utilization_step <= 0.5:
        raise v.error("policy.gpu_memory_utilization_step", "expected a step from 0.001 to 0.5")
    return policy


def _fixed_flags(v: _Validator, data: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """policy.fixed_flags as vLLM's option names (--block_size is --block-size); a typo is an error."""
    flags = tuple("--" + f[2:].replace("_", "-") if f.startswith("--") else f for f in v.string_list(data, where))
    newest = release_options(str(max(KNOWN))).by_spelling   # the newest parser kvwatch has read
    unknown = [f for f in flags if f not in newest]
    if unknown:
        raise v.error(where, f"{unknown[0]!r} is not an option of vllm serve (e.g. \"--block-size\")")
    return flags


def with_overrides(config: Config, *, name: str | None = None, listen: str | None = None,
                   state_dir: str | None = None, command: Sequence[str] | None = None,
                   preflight: bool | None = None, pin_kv_cache_memory: bool | None = None,
                   device: str | None = None, learned_dir: str | None = None) -> Config:
    """Command-line flags win over the file (docs/config.md)."""
    changes: dict[str, Any] = {}
    if device is not None:
        changes["device"] = validate_device(device, "--device")
    if name is not None:
        changes["name"] = validate_name(name, "--name")
    if listen is not None:
        parse_listen(listen)
        changes["listen"] = listen
    if state_dir is not None:
        changes["state_dir"] = state_dir
    if learned_dir is not None:
        _check_path(learned_dir, "--learned-dir", "a directory")
        changes["learned_dir"] = learned_dir
    if command:
        changes["engine"] = dataclasses.replace(config.engine, command=tuple(command))
    if pin_kv_cache_memory is not None:
        changes["engine"] = dataclasses.replace(changes.get("engine", config.engine),
                                                pin_kv_cache_memory=pin_kv_cache_memory)
    if preflight is not None:
        changes["policy"] = dataclasses.replace(config.policy, preflight=preflight)
    out = dataclasses.replace(config, **changes)
    # The final paths, wherever they came from: a NUL or blank one would fail only later, in os.replace.
    where = "--state-dir" if state_dir is not None else f"config {config.source}: state_dir"
    if state_dir is not None or out.state_dir:
        _check_path(out.state_dir, where, "a directory")
    if out.web_config is not None:
        _check_path(out.web_config, f"config {config.source}: web_config", "a file")
    if not out.state_dir:
        out = dataclasses.replace(out, state_dir=default_state_dir())
    if not out.engine.command:
        raise ConfigError(f"no engine command: set engine.command in {config.source} "
                          "or give it after `--` (kvwatch run -- vllm serve MODEL ...)")
    return out


def _check_path(path: str, where: str, what: str) -> None:
    if not path.strip() or "\0" in path:
        raise ConfigError(f"{where}: expected {what} (not blank, no NUL character)")


class _Validator:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, where: str, message: str) -> ConfigError:
        return ConfigError(f"config {self.source}: {where}: {message}")

    def no_unknown(self, data: Mapping[str, Any], prefix: str, known: Sequence[str] | Mapping[str, Any]) -> None:
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise self.error(prefix + unknown[0], f"unknown key (known: {', '.join(sorted(known))})")

    def table(self, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise self.error(key, "expected a table ([" + key + "])")
        return value

    def string(self, data: Mapping[str, Any], key: str, default: str) -> str:
        value = data.get(key.rsplit(".", 1)[-1], default)
        if not isinstance(value, str) or (key in data and not value):
            raise self.error(key, "expected a non-empty string")
        return value

    def string_list(self, data: Mapping[str, Any], key: str) -> list[str]:
        value = data.get(key.rsplit(".", 1)[-1], [])
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise self.error(key, 'expected a list of strings, e.g. ["vllm", "serve", "/models/m"]')
        if any("\0" in x for x in value):
            raise self.error(key, "a NUL character cannot be passed to a program")
        self._sizes(key, value)
        return value

    def _sizes(self, key: str, words: Sequence[str]) -> None:
        if len(words) > MAX_LIST_ITEMS:
            raise self.error(key, f"more than {MAX_LIST_ITEMS} entries")
        if any(len(w) > MAX_STRING_BYTES for w in words):
            raise self.error(key, f"an entry longer than {MAX_STRING_BYTES >> 10} KiB")

    def string_map(self, data: Mapping[str, Any], key: str) -> dict[str, str]:
        value = data.get(key.rsplit(".", 1)[-1], {})
        if not isinstance(value, dict):
            raise self.error(key, 'expected a table of strings, e.g. { HF_HUB_OFFLINE = "1" }')
        for k, x in value.items():
            if not isinstance(x, str):
                raise self.error(f"{key}.{k}", "expected a string (quote numbers: \"1\")")
            if not k or "=" in k or "\0" in k or "\0" in x:
                raise self.error(f"{key}.{k!r}", "not an environment variable (no '=' or NUL in a name, no NUL in a value)")
        self._sizes(key, [*value, *value.values()])
        return dict(value)

    def boolean(self, data: Mapping[str, Any], where: str, default: bool) -> bool:
        value = data.get(where.rsplit(".", 1)[-1], default)
        if not isinstance(value, bool):
            raise self.error(where, "expected true or false")
        return value

    def seconds(self, data: Mapping[str, Any], where: str, default: float, key: str | None = None) -> float:
        value = data.get(key or where.rsplit(".", 1)[-1], default)
        try:
            return bounded_seconds(value, where, where)
        except ConfigError as exc:
            raise ConfigError(f"config {self.source}: {exc}") from None

    def positive(self, data: Mapping[str, Any], where: str, default: float, key: str | None = None) -> float:
        value = data.get(key or where.rsplit(".", 1)[-1], default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
            raise self.error(where, "expected a finite number > 0")
        return float(value)
