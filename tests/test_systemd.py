"""systemd/kvwatch@.service, the sysusers file and the example config: clean for
systemd's own tools, and consistent with kvwatch's exit codes, CLI and config schema."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from operator_tools import REPO, UNIT_FILE, find_tool, in_ci

from kvwatch.exitcodes import EXIT_GAVE_UP

SYSUSERS_FILE = REPO / "systemd" / "kvwatch.sysusers"
EXAMPLE_CONFIG = REPO / "systemd" / "kvwatch-example.toml"
CONFIG_DOC = REPO / "docs" / "config.md"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections -> [(key, value)] in order; keys repeat (DeviceAllow=, Environment=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), "no continuation lines, keep the unit greppable"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        assert current is not None, line
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def unit() -> dict[str, list[tuple[str, str]]]:
    return parse_unit(UNIT_FILE.read_text())


def one(section: str, key: str) -> str:
    values = [v for k, v in unit()[section] if k == key]
    assert len(values) == 1, f"[{section}] {key}= appears {len(values)} times"
    return values[0]


def seconds(value: str) -> float:
    """systemd time span -> seconds ("45min", "120s", "2h 30min", "90")."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts and "".join(n + u for n, u in parts) == value.replace(" ", ""), value
    return sum(float(n) * units[u or "s"] for n, u in parts)


def exec_start_argv() -> list[str]:
    return shlex.split(one("Service", "ExecStart"))


def skip_or_fail(msg: str) -> None:
    if in_ci():
        pytest.fail(msg)
    pytest.skip(msg)


# --- systemd's own checks -----------------------------------------------------------

def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    """`systemd-analyze verify` prints nothing about the unit.

    verify needs an instance name (kvwatch@test.service) and an ExecStart binary that
    exists, so the copy points ExecStart at this Python. It does not look up User=/Group=
    (sysusers creates the user at install time; see test_sysusers_creates_the_user), and
    it reports unknown keys and bad values as warnings with exit status 0: hence the
    check on its output, not only its status.
    """
    analyze = find_tool("systemd-analyze")
    text = UNIT_FILE.read_text()
    binary = exec_start_argv()[0]
    assert text.count(binary) == 1
    copy = tmp_path / "kvwatch@test.service"
    copy.write_text(text.replace(binary, sys.executable))
    res = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    about_unit = [l for l in out.splitlines() if "kvwatch" in l or str(tmp_path) in l]
    assert res.returncode == 0, out
    assert not about_unit, "systemd-analyze verify complains:\n" + "\n".join(about_unit)


def test_systemd_analyze_security_exposure(tmp_path: Path) -> None:
    """The hardening stays in place: exposure at most 3.0 (0 best, 10 worst)."""
    analyze = find_tool("systemd-analyze")
    copy = tmp_path / "kvwatch@test.service"
    copy.write_text(UNIT_FILE.read_text().replace(exec_start_argv()[0], sys.executable))
    res = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(copy)],
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", res.stdout + res.stderr)
    if m is None:
        skip_or_fail(f"systemd-analyze security --offline unsupported here (systemd >= 250 needed): {res.stderr.strip()}")
        return
    assert float(m.group(1)) <= 3.0, res.stdout


def test_sysusers_creates_the_user(tmp_path: Path) -> None:
    sysusers = find_tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    res = subprocess.run([sysusers, f"--root={tmp_path}", str(SYSUSERS_FILE)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warn" not in (res.stdout + res.stderr).lower(), res.stdout + res.stderr
    passwd = {l.split(":")[0]: l.split(":") for l in (tmp_path / "etc/passwd").read_text().splitlines()}
    group = {l.split(":")[0]: l.split(":") for l in (tmp_path / "etc/group").read_text().splitlines()}
    user = passwd[one("Service", "User")]
    assert user[5] == "/var/lib/kvwatch" and user[6] == "/usr/sbin/nologin"
    assert int(user[2]) < 1000, "a system user"
    assert one("Service", "Group") in group
    for g in one("Service", "SupplementaryGroups").split():
        assert "kvwatch" in group[g][3].split(","), f"kvwatch not in group {g}"


# --- consistency with kvwatch -------------------------------------------------------

def test_restart_prevent_exit_status_is_gave_up() -> None:
    assert int(one("Service", "RestartPreventExitStatus")) == EXIT_GAVE_UP
    assert one("Service", "Restart") == "on-failure"


def test_exec_start_uses_the_documented_cli() -> None:
    argv = exec_start_argv()
    assert argv[:2] == ["/usr/local/bin/kvwatch", "run"], argv
    flags = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert len(argv[2:]) == 2 * len(flags), f"flags come in pairs: {argv}"
    assert flags == {"--config": "/etc/kvwatch/%i.toml", "--name": "%i", "--state-dir": "/var/lib/kvwatch"}
    doc = CONFIG_DOC.read_text()
    for flag in flags:
        assert flag in doc, f"{flag} is not documented in docs/config.md"
    # StateDirectory= creates (and owns) exactly the state dir kvwatch is given.
    assert "/var/lib/" + one("Service", "StateDirectory") == flags["--state-dir"]
    assert one("Unit", "AssertPathExists") == flags["--config"]


def test_notify_and_watchdog() -> None:
    assert one("Service", "Type") == "notify"
    assert one("Service", "NotifyAccess") == "main"
    interval = _example()["watch"]["interval_seconds"]
    assert seconds(one("Service", "WatchdogSec")) >= 4 * interval, "room for a few missed watch ticks"


def test_stop_and_start_timeouts_cover_the_engine() -> None:
    """systemd must not SIGKILL kvwatch while kvwatch is still stopping or starting the engine."""
    engine = _example()["engine"]
    assert one("Service", "KillMode") == "mixed"
    assert seconds(one("Service", "TimeoutStopSec")) >= engine["stop_timeout_seconds"] + 30
    assert seconds(one("Service", "TimeoutStartSec")) > engine["start_timeout_seconds"]
    documented = _documented_schema()["engine"]
    assert seconds(one("Service", "TimeoutStopSec")) >= documented["stop_timeout_seconds"] + 30
    assert seconds(one("Service", "TimeoutStartSec")) > documented["start_timeout_seconds"]
    # The start limit can only trip if its window holds Burst restarts.
    window = seconds(one("Unit", "StartLimitIntervalSec"))
    assert window > int(one("Unit", "StartLimitBurst")) * seconds(one("Service", "RestartSec"))


def test_gpu_devices_allowed_and_cuda_safe() -> None:
    service = unit()["Service"]
    assert one("Service", "DevicePolicy") == "closed"
    allowed = {v.split()[0] for k, v in service if k == "DeviceAllow"}
    assert "char-nvidia*" in allowed
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= allowed
    keys = {k: v for k, v in service}
    # Options that break CUDA, NCCL or vLLM (see the comments in the unit).
    assert keys.get("MemoryDenyWriteExecute", "no") == "no"
    assert keys.get("PrivateDevices", "no") == "no"
    assert keys.get("PrivateUsers", "no") == "no"
    assert keys.get("ProcSubset", "all") == "all"
    assert one("Service", "NoNewPrivileges") == "yes"
    assert one("Service", "ProtectSystem") == "strict"
    assert one("Service", "User") != "root"


def test_caches_live_in_writable_directories() -> None:
    """Under ProtectSystem=strict only State/CacheDirectory (and ReadWritePaths) are writable."""
    env = dict(v.split("=", 1) for k, v in unit()["Service"] if k == "Environment")
    writable = ["/var/lib/" + one("Service", "StateDirectory"), "/var/cache/" + one("Service", "CacheDirectory")]
    writable += [p for k, v in unit()["Service"] if k == "ReadWritePaths" for p in v.split()]
    assert env["HF_HOME"] == "/var/cache/kvwatch/huggingface"
    for name in ("HOME", "HF_HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR",
                 "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"):
        assert any(env[name] == w or env[name].startswith(w + "/") for w in writable), (name, env[name])


# --- the example config -------------------------------------------------------------

def _example() -> dict:
    return tomllib.loads(EXAMPLE_CONFIG.read_text())


def _documented_schema() -> dict:
    m = re.search(r"```toml\n(.*?)```", CONFIG_DOC.read_text(), re.S)
    assert m, "no toml block in docs/config.md"
    return tomllib.loads(m.group(1))


def _check_against(example: dict, schema: dict, path: str = "") -> None:
    for key, value in example.items():
        where = f"{path}{key}"
        assert key in schema, f"{where} is not in the schema of docs/config.md"
        if isinstance(schema[key], dict) and key != "environment":
            assert isinstance(value, dict), where
            _check_against(value, schema[key], where + ".")
        elif isinstance(schema[key], float):
            assert isinstance(value, (int, float)), where
        else:
            assert type(value) is type(schema[key]), f"{where}: {type(value).__name__}, documented {type(schema[key]).__name__}"


def test_example_config_follows_the_schema() -> None:
    example = _example()
    _check_against(example, _documented_schema())
    assert example["engine"]["command"][:2] == ["vllm", "serve"]
    assert all(isinstance(a, str) for a in example["engine"]["command"])
    # Installed as /etc/kvwatch/<name>.toml for kvwatch@<name>; --name overrides, keep them equal.
    assert example["name"] == "kimi"
    assert example["state_dir"] == dict(zip(exec_start_argv()[2::2], exec_start_argv()[3::2], strict=False))["--state-dir"]
