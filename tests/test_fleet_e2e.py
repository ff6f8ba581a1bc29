"""A fleet without a cluster: `kvwatch run` instances as hosts, each with its own state directory and
one learned_dir they share, on the NVML stand-in as an H100, the engine stand-in replaying a real
H100 start-up log (vllm#10511: Llama 3 8B, "available_kv_cache_memory 53.29GiB"), the pieces of
tests/test_gpu_convergence_e2e.py.

Host A plans from the estimate, learns the engine's profile and shares it. Host B's first plan, before
its engine says anything, is `learned` and equals the blocks the engine reports. A host with another
card, and one with another vLLM release (its installed version as kvwatch reads it from package
metadata), find nothing that holds for them and plan from the estimate, as before."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from engine_support import free_port, http_get, write_model
from exporter_support import samples, value
from nvml_standin import NvmlStandin, StandinGpu, StandinState
from test_gpu_convergence_e2e import GPU_LOGS, LOGGED_BLOCKS, UUID, installed_release_env, plan_sources, wait_for

from kvwatch.watchdog import learned_store

REPO = Path(__file__).resolve().parent.parent
FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")
H100 = StandinGpu(uuid=UUID, name="NVIDIA H100 80GB HBM3", memory_total_bytes=81_559 * 2**20,
                  compute_capability=(9, 0))


class Host:
    """One `kvwatch run` as one host: its own state directory, NVML state and port; the shared learned_dir."""

    def __init__(self, tmp: Path, name: str, model: Path, blocks: Path, learned: Path, gpu: StandinGpu,
                 standin: NvmlStandin, extra_env: dict[str, str] | None = None) -> None:
        self.root = tmp / name
        self.root.mkdir()
        nvml_state = self.root / "nvml-state"
        StandinState(gpus=[gpu]).write(nvml_state)
        self.port = free_port()
        self.metrics = f"http://127.0.0.1:{self.port}/metrics"
        log = GPU_LOGS / next(r for r in json.loads((GPU_LOGS / "corpus.json").read_text())
                              if r["name"] == "pr10511_llama3_8b_h100_tp1")["log_file"]
        engine = [sys.executable, FAKE, "--model", str(model), "--port", str(free_port()), "--ready-after", "4",
                  "--startup-log", str(log), "--blocks-file", str(blocks)]
        self.argv = [sys.executable, "-m", "kvwatch.cli", "run", "--name", "llama", "--device", "gpu",
                     "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(self.root / "state"),
                     "--learned-dir", str(learned), "--", *engine]
        self.env = {**installed_release_env(tmp), **standin.env, "NVML_STANDIN_STATE": str(nvml_state),
                    **(extra_env or {})}
        self.log = self.root / "kvwatch-run.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Host:
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(timeout=30) == 0
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def first_plan(self) -> set[str]:
        return wait_for(lambda: plan_sources(self.metrics), 30, f"{self.root.name}'s first plan")

    def blocks(self, kind: str) -> float | None:
        return value(samples(http_get(self.metrics)[1]), f"kvwatch_kv_{kind}_blocks", engine="llama", rank="0")

    def kvwatch_log(self) -> str:
        return self.log.read_text(errors="replace")


def test_what_one_host_learns_plans_the_next_hosts_first_launch(tmp_path: Path, nvml_standin: NvmlStandin) -> None:
    corpus = {r["name"]: r for r in json.loads((GPU_LOGS / "corpus.json").read_text())}
    config = {k: v for k, v in corpus["pr10511_llama3_8b_h100_tp1"]["model_config"].items() if v is not None}
    model = write_model(tmp_path / "llama3-8b", config)
    blocks = tmp_path / "engine-cache.txt"
    blocks.write_text(f"16 {LOGGED_BLOCKS}")
    learned = tmp_path / "fleet-learned"

    # Host A: nothing shared yet, so the estimate; the engine's profile lines make it learned, and shared.
    with Host(tmp_path, "host-a", model, blocks, learned, H100, nvml_standin) as a:
        a.first_plan()
        wait_for(lambda: plan_sources(a.metrics) == {"learned"}, 30, "host A's learned plan")
        files = wait_for(lambda: list(learned.glob("*.json")), 30, "host A's shared profile")
    [shared] = files
    profile = json.loads(shared.read_text())
    assert profile["card"] == H100.name and profile["card_memory_bytes"] == H100.memory_total_bytes
    assert profile["available_kv_bytes"] == int(53.29 * 2**30)      # the engine's figure, as it logged it
    assert profile["host"] and profile["written_at"] > 0
    assert learned_store.read(learned, shared.name.split("-rank")[0]) is not None

    # Host B: its own (empty) state directory; its first plan, before the engine says anything, is learned,
    # and it is what the engine then reports.
    with Host(tmp_path, "host-b", model, blocks, learned, H100, nvml_standin) as b:
        assert b.first_plan() == {"learned"}
        assert b.blocks("planned") == LOGGED_BLOCKS
        wait_for(lambda: b.blocks("actual") == LOGGED_BLOCKS, 30, "host B's engine's blocks")
        assert b.blocks("planned") == b.blocks("actual")
    assert "learned_dir: planning with profile" in b.kvwatch_log()
    assert not (tmp_path / "host-b" / "state" / "llama.json").read_text().count('"learned_non_kv": {}')

    # Another card (the PCIe H100: other name, less memory): nothing holds for it.
    pcie = StandinGpu(uuid=UUID, name="NVIDIA H100 PCIe", memory_total_bytes=81_559 * 2**20 - 2**30,
                      compute_capability=(9, 0))
    with Host(tmp_path, "host-c", model, blocks, learned, pcie, nvml_standin) as c:
        c.first_plan()

    # Another vLLM release: the installed version kvwatch reads from package metadata says 0.31.0.
    other = installed_release_env(tmp_path, "0.31.0")
    with Host(tmp_path, "host-d", model, blocks, learned, H100, nvml_standin,
              {"PYTHONPATH": other["PYTHONPATH"]}) as d:
        d.first_plan()
    # (their first plans are estimates; by the time a scrape sees one the engine's own lines may already
    # have made it learned on a loaded machine, so the kvwatch log is the witness)
    for host in (a, c, d):
        assert "learned_dir: no profile" in host.kvwatch_log()
        assert "learned_dir: planning with profile" not in host.kvwatch_log()
