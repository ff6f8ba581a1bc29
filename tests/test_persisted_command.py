"""A command read back from the state file is launched only when it is the configured one with
kvwatch's own flag changes (a forged `/bin/sh -c ...` in the state file once ran as root)."""
from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from engine_support import llama_config, write_model
from fake_os import FakeClock, FakeOs, Launch

from kvwatch.planner.devices import Device
from kvwatch.planner.rules import ruleset_for
from kvwatch.policy import Policy
from kvwatch.watchdog.config import Config, EngineConfig
from kvwatch.watchdog.persisted_command import judge_persisted
from kvwatch.watchdog.sd_notify import SdNotifier
from kvwatch.watchdog.state_store import EngineRecord, write_atomic
from kvwatch.watchdog.supervisor import Supervisor

C = ("vllm", "serve", "/models/m", "--port", "8000", "--block-size", "8", "--attention-backend", "FLASH_ATTN")
R = "0.32.0"

# name, persisted, fixed flags, accepted, the reason's words
ROWS: list[tuple[str, tuple[str, ...], tuple[str, ...], bool, str]] = [
    ("the configured command itself", C, (), True, ""),
    ("a block size kvwatch corrected", C[:6] + ("32",) + C[7:], (), True, ""),
    ("a backend kvwatch removed", C[:7], (), True, ""),
    ("corrections stacked: dtype, length, seqs", C + ("--kv-cache-dtype", "fp8", "--max-model-len", "2048",
                                                      "--max-num-seqs=4"), (), True, ""),
    ("a host-OOM correction: less offload, one loading worker", C + ("--cpu-offload-gb", "2",
                                                                     "--max-parallel-loading-workers", "1"), (), True, ""),
    ("the autopilot's tensor parallel size", C + ("--tensor-parallel-size", "2"), (), True, ""),
    ("a forged shell", ("/bin/sh", "-c", "id > /tmp/pwned"), (), False, "another executable"),
    ("the shell with the model's words after it", ("/bin/sh", "-c", "x", "serve", "/models/m"), (), False,
     "another executable"),
    ("vllm from another path", ("/tmp/vllm",) + C[1:], (), False, "another executable"),
    ("another model", C[:2] + ("/tmp/evil",) + C[3:], (), False, "another model"),
    ("another model by --model", C + ("--model", "/tmp/evil"), (), False, "another model"),
    ("a flag kvwatch never adds", C + ("--trust-remote-code",), (), False, "'--trust-remote-code'"),
    ("a chat template kvwatch never sets", C + ("--chat-template", "/tmp/t.jinja"), (), False, "--chat-template"),
    ("another port", C[:4] + ("9000",) + C[5:], (), False, "'9000'"),
    ("a fleet's fixed flag changed", C[:6] + ("32",) + C[7:], ("--block-size",), False, "'32'"),
    ("a kvwatch flag that swallows no value", C + ("--max-model-len", "--trust-remote-code"), (), False,
     "vLLM would not read it"),
    ("an empty command", (), (), False, "empty command"),
]


@pytest.mark.parametrize("name,persisted,fixed,accepted,why", ROWS, ids=[r[0] for r in ROWS])
def test_the_persisted_command_table(name: str, persisted: tuple[str, ...], fixed: tuple[str, ...],
                                     accepted: bool, why: str) -> None:
    verdict = judge_persisted(persisted, C, R, fixed)
    assert verdict.accepted is accepted
    assert why in verdict.reason and (verdict.reason == "") is accepted


def test_a_forged_state_file_launches_the_configured_command(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    model = write_model(tmp_path / "tiny", llama_config())
    argv = ("vllm", "serve", str(model), "--port", "8000")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    forged = EngineRecord(name="t", original_argv=list(argv), argv=["/bin/sh", "-c", "id > /tmp/pwned"])
    write_atomic(state / "t.json", json.dumps(forged.to_json()).encode())
    engine = EngineConfig(command=argv, start_timeout_seconds=5.0, health_interval_seconds=1.0,
                          hang_timeout_seconds=4.0, stop_timeout_seconds=3.0)
    config = Config(name="t", state_dir=str(state), engine=engine, policy=Policy(preflight=False))
    clock = FakeClock()
    fake_os = FakeOs(clock, [Launch(ready_after=1)])
    sup = Supervisor(config, clock=clock, device=Device("cpu", "test cpu", cpu_fp8_kv=False, source="cpu"),
                     rules=ruleset_for(R), notifier=SdNotifier(None), output=io.BytesIO(), environ={},
                     probe=fake_os.probe, os_interface=fake_os)
    clock.at(clock.now() + 5, lambda: sup.request_stop("test stop"))
    with caplog.at_level(logging.WARNING):
        sup.run()
    assert [list(a) for a in fake_os.spawned] == [list(argv)]
    assert "holds a command kvwatch did not write (another executable" in caplog.text
    assert json.loads((state / "t.json").read_text())["argv"] == list(argv)
