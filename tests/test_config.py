"""The TOML config of `kvwatch run` (kvwatch/watchdog/config.py): its example, its errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.errors import ConfigError
from kvwatch.watchdog.config import config_from_mapping, load_config, with_overrides

ROOT = Path(__file__).resolve().parent.parent


def test_example_config_loads() -> None:
    cfg = load_config(ROOT / "systemd" / "kvwatch-example.toml")
    assert cfg.name == "kimi" and cfg.listen_address == ("0.0.0.0", 9400)
    assert cfg.engine.command[:3] == ("vllm", "serve", "/models/Kimi-K2")
    assert cfg.engine.start_timeout_seconds == 2400 and cfg.engine.environment == {"HF_HUB_OFFLINE": "1"}
    assert cfg.policy.max_corrections == 5 and cfg.policy.preflight is True
    assert cfg.watch.interval_seconds == 5


@pytest.mark.parametrize("data, needle", [
    ({"engine": {"command": ["vllm"], "hang_timeout_second": 5}}, "engine.hang_timeout_second: unknown key"),
    ({"engine": {"command": "vllm serve m"}}, "engine.command: expected a list of strings"),
    ({"engine": {"command": ["v"], "stop_timeout_seconds": -1}},
     "engine.stop_timeout_seconds: expected a finite number of seconds from 1 to 3600, got -1"),
    ({"engine": {"command": ["v"], "health_interval_seconds": 1e-300}},
     "engine.health_interval_seconds: expected a finite number of seconds from 0.1 to 3600"),
    ({"engine": {"command": ["v"], "start_timeout_seconds": 1e300}}, "engine.start_timeout_seconds: expected"),
    ({"watch": {"interval_seconds": 0.001}}, "watch.interval_seconds: expected a finite number of seconds from 0.1"),
    ({"policy": {"backoff_max_seconds": 1e-300}}, "policy.backoff_max_seconds: expected a finite number of seconds"),
    ({"policy": {"max_restarts": 10**12}}, "policy.max_restarts: expected a whole number from 0 to 1000"),
    ({"policy": {"gpu_memory_utilization_step": 1e-300}}, "policy.gpu_memory_utilization_step: expected a step"),
    ({"engine": {"command": ["v"] * 5000}}, "engine.command: more than 4096 entries"),
    ({"engine": {"command": ["v" * 200_000]}}, "engine.command: an entry longer than 128 KiB"),
    ({"engine": {"command": ["v"], "environment": {"X": "y" * 200_000}}}, "engine.environment: an entry longer"),
    ({"engine": {"command": ["v"], "environment": {"X": 1}}}, "engine.environment.X: expected a string"),
    ({"policy": {"max_restarts": "5"}}, "policy.max_restarts: expected a whole number"),
    ({"policy": {"preflight": 1}}, "policy.preflight: expected true or false"),
    ({"engine": {"command": ["v"], "pin_kv_cache_memory": "yes"}}, "engine.pin_kv_cache_memory: expected true or false"),
    ({"watch": {"all_gpus": 1}}, "watch.all_gpus: expected true or false"),
    ({"device": "tpu"}, "device 'tpu': expected cpu, gpu or a GPU index"),
    ({"device": True}, "device 'True': expected cpu, gpu or a GPU index"),
    ({"policy": {"backoff_initial_seconds": 100}}, "policy.backoff_initial_seconds: larger than"),
    ({"listen": "9400"}, "listen '9400': expected HOST:PORT"),
    ({"name": "../etc"}, "name '../etc'"),
    ({"surprise": 1}, "surprise: unknown key"),
    ({"watch": []}, "watch: expected a table"),
    ({"autopilot": {"apply": "always"}}, "autopilot.apply: expected one of 'never', 'at_restart', 'window'"),
    ({"autopilot": {"apply": True}}, "autopilot.apply: expected one of"),
    ({"autopilot": {"apply": "window"}}, 'autopilot.window: apply = "window" needs a window'),
    ({"autopilot": {"apply": "window", "window": "2:00-4:00"}}, "autopilot.window: autopilot window '2:00-4:00': "
                                                                "expected HH:MM-HH:MM"),
    ({"autopilot": {"apply": "window", "window": 200}}, 'autopilot.window: expected a string "HH:MM-HH:MM"'),
    ({"autopilot": {"apply": "at_restart", "window": "02:00-04:00"}}, 'autopilot.window: a window is used only'),
    ({"autopilot": {"drain_timeout_seconds": -1}},
     "autopilot.drain_timeout_seconds: expected a finite number of seconds from 0 to 3600, got -1"),
    ({"autopilot": {"measure_seconds": 1}}, "autopilot.measure_seconds: expected a finite number of seconds from 10"),
    ({"autopilot": {"max_changes_per_day": 0}}, "autopilot.max_changes_per_day: expected a whole number from 1 to 24"),
    ({"autopilot": {"max_changes_per_day": 2.5}}, "autopilot.max_changes_per_day: expected a whole number"),
    ({"autopilot": {"apply_at": "never"}}, "autopilot.apply_at: unknown key"),
    ({"autopilot": "window"}, "autopilot: expected a table"),
])
def test_config_errors_are_one_clear_line(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, "k.toml")
    message = str(info.value)
    assert needle in message and "\n" not in message and message.startswith("config k.toml: ")


def test_the_autopilot_section() -> None:
    from kvwatch.watchdog.autopilot import Apply, AutopilotConfig
    assert config_from_mapping({}).autopilot == AutopilotConfig() and AutopilotConfig().apply is Apply.NEVER
    cfg = config_from_mapping({"autopilot": {"apply": "window", "window": "23:00-01:00", "drain_timeout_seconds": 0,
                                             "measure_seconds": 60, "max_changes_per_day": 3}}).autopilot
    assert cfg == AutopilotConfig(Apply.WINDOW, "23:00-01:00", 0.0, 60.0, 3)
    assert config_from_mapping({"autopilot": {"apply": "at_restart"}}).autopilot.apply is Apply.AT_RESTART


def test_config_cli_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine\ncommand = 1\n")
    empty = tmp_path / "empty.toml"
    empty.write_text("name = 'x'\n")
    for args, needle in [(["--config", str(bad)], "not valid TOML"),
                         (["--config", str(tmp_path / "missing.toml")], "cannot read"),
                         (["--config", str(empty)], "no engine command"),
                         (["--name", "a/b", "--", "vllm", "serve", "m"], "--name 'a/b'")]:
        proc = subprocess.run([sys.executable, "-m", "kvwatch.cli", "run", *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("text, needle", [
    ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ("x = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n", "nested too deeply"),
])
def test_a_deeply_nested_config_is_one_clear_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"config {path}: {needle}"


def test_a_giant_config_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "giant.toml"
    with open(path, "wb") as f:       # 200 MB of comment lines (sparse: the disk is not filled)
        f.write(b"# x\n" * 1024)
        f.truncate(200 * 10**6)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"config {path}: larger than 1 MiB: not a kvwatch config"


@pytest.mark.parametrize("data, flag, needle", [
    ({"state_dir": "/var/lib/kv\0watch"}, None, "config k.toml: state_dir: expected a directory"),
    ({"state_dir": "   "}, None, "config k.toml: state_dir: expected a directory"),
    ({"web_config": "/etc/web\0.yml"}, None, "config k.toml: web_config: expected a file"),
    ({"web_config": " "}, None, "config k.toml: web_config: expected a file"),
    ({}, "/tmp/a\0b", "--state-dir: expected a directory"),
    ({}, "", "--state-dir: expected a directory"),
    ({"state_dir": "/var/lib/kvwatch"}, " ", "--state-dir: expected a directory"),
])
def test_a_nul_or_blank_path_is_refused_from_the_file_or_the_flag(data: dict, flag: str | None, needle: str) -> None:
    """Checked once, on the final paths: a NUL from the file used to pass and crash later in os.replace."""
    config = config_from_mapping({**data, "engine": {"command": ["vllm", "serve", "m"]}}, "k.toml")
    with pytest.raises(ConfigError) as info:
        with_overrides(config, state_dir=flag)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)


def test_the_flag_replaces_a_bad_state_dir_from_the_file() -> None:
    config = config_from_mapping({"state_dir": "/a\0b", "engine": {"command": ["vllm"]}}, "k.toml")
    assert with_overrides(config, state_dir="/srv/kvwatch").state_dir == "/srv/kvwatch"


def test_pinning_from_the_file_or_the_flag() -> None:
    base = config_from_mapping({"engine": {"command": ["vllm", "serve", "m"]}}, "k.toml")
    assert base.engine.pin_kv_cache_memory is False
    pinned = config_from_mapping({"engine": {"command": ["vllm"], "pin_kv_cache_memory": True}}, "k.toml")
    assert pinned.engine.pin_kv_cache_memory is True
    flagged = with_overrides(base, command=["vllm", "serve", "other"], pin_kv_cache_memory=True)
    assert flagged.engine.pin_kv_cache_memory is True and flagged.engine.command == ("vllm", "serve", "other")


def test_the_device_from_the_file_or_the_flag() -> None:
    base = config_from_mapping({"engine": {"command": ["vllm"]}, "device": 1}, "k.toml")
    assert base.device == "1"
    assert with_overrides(base, device="gpu").device == "gpu"
    with pytest.raises(ConfigError, match="--device 'x'"):
        with_overrides(base, device="x")
