"""`kvwatch export` on a serving engine it did not start: stalls and KV pressure, as under `kvwatch run`.

A real `kvwatch export` subprocess watches the engine stand-in (tests/fake_engine.py), whose /metrics
reports the load a file says (--load-file "RUNNING PROMPT GEN [PREEMPTIONS WAITING]"). The decisions are
the watchdog's pure ones (watchdog/progress.py, watchdog/pressure_watch.py); what is tested here is that
the exporter feeds them the engine's own series and exports what they find.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine_support import free_port, http_get, llama_config, write_model
from exporter_support import samples, series, value
from test_export import kvwatch, scrape_when_ready
from waiting import eventually

FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")


@contextmanager
def exported(tmp_path: Path, load: str, *flags: str) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    """The stand-in serving `load` (the file it reads per scrape) and `kvwatch export` watching it on
    an H100 plan (where an fp8 KV cache is legal) every 0.2 s: kvwatch's URL, the load file."""
    model = write_model(tmp_path / "tiny", llama_config())
    load_file = tmp_path / "load"
    load_file.write_text(load)
    port = free_port()
    # in a group of its own: its EngineCore stand-in child goes with it at the end
    engine = subprocess.Popen([sys.executable, FAKE, "--model", str(model), "--port", str(port),
                               "--load-file", str(load_file)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                              start_new_session=True)
    listen = free_port()
    proc = kvwatch("export", "--engine-url", f"http://127.0.0.1:{port}", "--name", "ext", "--model", str(model),
                   "--preset", "h100", "--no-nvml", "--listen", f"127.0.0.1:{listen}", "--interval", "0.2", *flags)
    url = f"http://127.0.0.1:{listen}"
    try:
        scrape_when_ready(url, proc)
        assert eventually(lambda: value(scrape(url), "kvwatch_engine_up", engine="ext") == 1, 20)
        yield url, load_file, proc
    finally:
        proc.kill()
        proc.wait()
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()


def scrape(url: str) -> dict:
    return samples(http_get(url + "/metrics", timeout=2)[1])


def stalls(url: str) -> float | None:
    return value(scrape(url), "kvwatch_engine_failures_total", engine="ext", kind="stalled")


def test_export_reports_a_stall_and_its_end(tmp_path: Path) -> None:
    """Idle and a long generation are never stalls; a request that runs with no token for the stall
    timeout is one stalled failure (KvwatchEngineStalled's series) and /-/ready 503 with the counters,
    until tokens come again."""
    with exported(tmp_path, "0 100 50", "--stall-timeout", "1") as (url, load, _):
        time.sleep(2.0)                                   # idle: nothing runs
        for generated in range(51, 71):                   # a long generation: tokens keep coming for 3 s
            load.write_text(f"1 100 {generated}")
            time.sleep(0.15)
        assert stalls(url) == 0
        assert http_get(url + "/-/ready")[0] == 200
        frozen = time.monotonic()                          # the worker wedges: the counters stop
        assert eventually(lambda: stalls(url) == 1, 10), scrape(url)
        assert time.monotonic() - frozen <= 1.0 + 0.2 + 2.0
        status, body = http_get(url + "/-/ready")
        assert status == 503 and "stalled: 1 requests running and no token" in body, body
        assert "vllm:generation_tokens_total 70" in body
        assert value(scrape(url), "kvwatch_engine_up", engine="ext") == 1   # /health still answers
        time.sleep(1.0)
        assert stalls(url) == 1                             # one stall, counted once while it lasts
        load.write_text("1 100 71")                          # tokens again
        assert eventually(lambda: http_get(url + "/-/ready")[0] == 200, 10)
        assert stalls(url) == 1


def test_export_with_no_stall_timeout_never_flags(tmp_path: Path) -> None:
    with exported(tmp_path, "1 100 50", "--stall-timeout", "0") as (url, _, _):
        time.sleep(2.0)
        assert stalls(url) == 0 and http_get(url + "/-/ready")[0] == 200


def test_export_recommends_a_change_under_kv_pressure(tmp_path: Path) -> None:
    """Preemptions while serving: the planner's change (fp8 KV on an H100) with the KV tokens before and
    after, as kvwatch_recommendation_info and its expected figures; none before the pressure."""
    with exported(tmp_path, "2 100 50 0 0", "--pressure-window", "10") as (url, load, _):
        assert value(scrape(url), "kvwatch_recommendation_info", engine="ext",
                     change="--kv-cache-dtype fp8") is None
        start, step = time.monotonic(), 0
        found = scrape(url)
        while time.monotonic() - start < 25 and not series(found, "kvwatch_recommendation_info"):
            step += 1
            load.write_text(f"2 {100 + step} {50 + 10 * step} {step} 3")   # serving, and preempting
            time.sleep(0.25)
            found = scrape(url)
        rows = series(found, "kvwatch_recommendation_info")
        assert len(rows) == 1, found
        assert rows[0]["change"] == "--kv-cache-dtype fp8", rows
        assert "preemptions per minute: an fp8 KV cache holds twice the tokens" in rows[0]["reason"], rows
        before = value(found, "kvwatch_recommendation_kv_tokens", engine="ext", plan="current")
        after = value(found, "kvwatch_recommendation_kv_tokens", engine="ext", plan="recommended")
        assert before is not None and after is not None and after > before, (before, after)
