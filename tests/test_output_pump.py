"""The engine's output pump (kvwatch/watchdog/output_pump.py) and the pipe it reads."""
from __future__ import annotations

import fcntl
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from waiting import eventually

from kvwatch.boundary import spawn
from kvwatch.watchdog.output_pump import LogFacts, LogSink, OutputPump, parse_fact

FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")
LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"


def test_pump_never_blocks_the_engine_on_50_mb() -> None:
    proc = subprocess.Popen([sys.executable, FAKE, "--flood", "50"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    sink = io.BytesIO()
    pump = OutputPump("flood", proc.stdout.fileno(), sink, ring_lines=1000).start()
    started = time.monotonic()
    assert proc.wait(timeout=60) == 0
    assert pump.join(timeout=30)
    elapsed = time.monotonic() - started
    proc.stdout.close()
    assert pump.bytes_seen > 50 * 2**20
    lines = pump.lines()
    assert len(lines) == 1000 and lines[-1] == "flood done"
    assert sink.getvalue().endswith(b"[flood] flood done\n")
    assert elapsed < 30, elapsed


def test_pump_handles_bad_utf8_giant_lines_and_parses_startup_facts() -> None:
    read_end, write_end = os.pipe()
    pump = OutputPump("e", read_end, None, max_line=1000).start()
    log = (LOGS / "cpu_engine_died.log").read_bytes()
    os.write(write_end, b"bad \xff\xfe bytes\r\n" + b"y" * 2500 + b"\n" + log + b"no newline at end")
    os.close(write_end)
    assert pump.join(timeout=10)
    os.close(read_end)
    lines = pump.lines()
    assert lines[0] == "bad \ufffd\ufffd bytes"
    assert lines[1:4] == ["y" * 1000, "y" * 1000, "y" * 500]
    assert lines[-1] == "no newline at end"
    facts = pump.facts
    assert facts.kv_tokens is not None and facts.kv_tokens > 0


def test_pump_passes_the_engine_log_through_but_not_kvwatchs_own_probes() -> None:
    read_fd, write_fd = os.pipe()
    sink = io.BytesIO()
    pump = OutputPump("e", read_fd, sink).start()
    os.write(write_fd, b'(APIServer pid=1) INFO:     127.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK\n'
                       b'(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK\n'
                       b'(APIServer pid=1) INFO:     127.0.0.1:5000 - "GET /health HTTP/1.1" 503 Service Unavailable\n'
                       b'(APIServer pid=1) INFO:     10.1.2.3:41000 - "GET /metrics HTTP/1.1" 200 OK\n')
    os.close(write_fd)
    assert pump.join(5)
    out = sink.getvalue().decode()
    assert "POST /v1/completions" in out and "503" in out and '"GET /health HTTP/1.1" 200' not in out
    assert "10.1.2.3:41000" in out  # another host's scrape is the operator's business: shown
    assert len(pump.lines()) == 4  # the diagnosis still sees every line


def test_pump_counts_lines_and_keeps_a_bounded_tail_for_lines_since() -> None:
    read_fd, write_fd = os.pipe()
    pump = OutputPump("e", read_fd, None, ring_lines=100_000, ring_bytes=64 * 1024).start()
    stats = b"(APIServer pid=1) INFO [loggers.py:259] Engine 000: GPU KV cache usage: 4.2%, Running: 1 reqs\n"
    os.write(write_fd, b"".join(b"line %d\n" % i for i in range(10)))
    eventually(lambda: pump.lines_seen >= 10, 5, 0.01)  # let the pump take these first, as while the engine starts
    seen = pump.lines_seen
    assert seen == 10
    with os.fdopen(write_fd, "wb") as writer:  # then a flood, far past the tail's 64 KiB
        for _ in range(4000):
            writer.write(stats)
        writer.write(b"(EngineCore pid=2) INFO [kv_cache_utils.py:1] GPU KV cache size: 1,024 tokens\n"
                     b"engine died\n")
    assert pump.join(5)
    os.close(read_fd)
    assert pump.lines_seen == 10 + 4000 + 2
    newer = pump.lines_since(seen)
    assert newer[-1] == "engine died" and len(newer) < 4002  # the tail is bounded by bytes ...
    assert 64 * 1024 <= sum(len(line) + 1 for line in newer) <= 64 * 1024 + 2**20  # ... not emptied
    assert pump.lines_since(pump.lines_seen) == []
    assert pump.lines()[-2:] == newer[-2:]
    # the serving stats say "KV cache" on every line; only the fact line counts
    assert pump.facts == LogFacts(kv_tokens=1024)


def test_spawn_gives_the_engine_the_largest_pipe_the_kernel_allows() -> None:
    expected = spawn._pipe_max()   # this host's fs.pipe-max-size (1 MiB unless an admin raised it)
    proc = spawn.spawn([sys.executable, "-c", "pass"], dict(os.environ))
    try:
        assert fcntl.fcntl(proc.stdout, fcntl.F_GETPIPE_SZ) == expected
    finally:
        proc.popen.wait()
        proc.close()


def test_the_pipe_follows_pipe_max_size_and_falls_back_to_the_default(tmp_path: Path) -> None:
    # A fake pipe-max-size: 4 MiB is above the default (the pipe follows it where the kernel lets
    # this process: root may; otherwise the 1 MiB default, never less); a garbage one is the default.
    rows = [("4194304\n", {4 << 20, 1 << 20}), ("not a number\n", {1 << 20}), ("", {1 << 20}),
            ("4095\n", {1 << 20})]
    for text, allowed in rows:
        (tmp_path / "max").write_text(text)
        read, write = os.pipe()
        try:
            size = spawn._enlarge_pipe(read, str(tmp_path / "max"))
            assert size == fcntl.fcntl(read, fcntl.F_GETPIPE_SZ) and size in allowed, text
        finally:
            os.close(read)
            os.close(write)
    assert spawn._pipe_max(str(tmp_path / "missing")) == 1 << 20


def test_parse_fact_startup_lines() -> None:
    facts = parse_fact("(Worker pid=1) INFO [gpu_worker.py:760] Available KV cache memory: 61.23 GiB", LogFacts())
    facts = parse_fact("(EngineCore pid=2) INFO GPU KV cache size: 1,398,080 tokens, Maximum concurrency ...", facts)
    assert facts.kv_tokens == 1_398_080 and facts.available_kv_bytes == int(61.23 * 2**30)
    assert parse_fact("unrelated", facts) is facts


def test_a_line_that_only_looks_like_a_startup_fact_does_not_stop_the_pump() -> None:
    """'Available KV cache memory: 1.2.3 GiB' (or 400 digits) once ended the pump's thread: nobody
    read the pipe after it and the engine blocked on its next write. The pump reads on."""
    read_end, write_end = os.pipe()
    pump = OutputPump("odd", read_end, None).start()
    odd = (b"INFO Available KV cache memory: 1.2.3 GiB\n"
           b"INFO Available KV cache memory: " + b"9" * 400 + b" GiB\n"
           b"INFO CPU KV cache size: , tokens\n")

    def engine() -> None:
        os.write(write_end, odd)
        for i in range(2000):   # ~260 KiB after the odd lines: more than a pipe holds unread
            os.write(write_end, b"line %d %s\n" % (i, b"x" * 120))
        os.write(write_end, b"INFO CPU KV cache size: 63,550 tokens\n")
        os.close(write_end)

    writer = threading.Thread(target=engine, daemon=True)
    writer.start()
    writer.join(timeout=20)
    assert not writer.is_alive(), "the engine blocked on its pipe: the pump stopped reading"
    assert pump.join(timeout=10)
    os.close(read_end)
    assert pump.lines()[-1] == "INFO CPU KV cache size: 63,550 tokens"
    assert pump.facts == LogFacts(kv_tokens=63550, available_kv_bytes=None)


def test_the_memory_lines_after_the_kv_size_are_read_and_nothing_after_the_start() -> None:
    """vLLM V1 logs its CUDA graph memory after the KV cache size; "init engine ... took" ends its
    start-up, and a later line that looks like a fact (an echo of the log, a replay) changes nothing."""
    read_end, write_end = os.pipe()
    pump = OutputPump("start", read_end, None).start()
    os.write(write_end, b"(EngineCore_0 pid=2881) INFO [gpu_model_runner.py:2007] Model loading took 14.2488 GiB\n"
                        b"(EngineCore_0 pid=2881) INFO [gpu_worker.py:276] Available KV cache memory: 24.83 GiB\n"
                        b"(EngineCore_0 pid=2881) INFO [kv_cache_utils.py:849] GPU KV cache size: 464,848 tokens\n")
    time.sleep(0.05)   # a block of its own: the pump has seen the KV size before the graph line comes
    os.write(write_end, b"(EngineCore_0 pid=2881) INFO [gpu_model_runner.py:2708] Graph capturing finished in 3 "
                        b"secs, took 0.50 GiB\n(EngineCore_0 pid=2881) INFO [core.py:214] init engine (profile, "
                        b"create kv cache, warmup model) took 23.13 seconds\n")
    time.sleep(0.05)
    os.write(write_end, b"INFO Available KV cache memory: 99.00 GiB\n")
    os.close(write_end)
    assert pump.join(timeout=10)
    os.close(read_end)
    facts = pump.facts
    assert facts.started and facts.kv_tokens == 464_848
    assert {part: round(value / 2**30, 4) for part, value in facts.memory_parts().items()} == {
        "weights": 14.2488, "kv_cache": 24.83, "cuda_graphs": 0.5}


# An engine that logs ~2 MB/s in 200-byte lines for `seconds` and prints its longest write (ms).
_LOGGER = r"""
import os, sys, time
seconds = float(sys.argv[1])
line = b"x" * 199 + b"\n"
block = line * 100                     # 20 kB, 100 times a second
longest, lines = 0.0, 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    start = time.monotonic()
    os.write(1, block)
    longest = max(longest, time.monotonic() - start)
    lines += 100
    time.sleep(0.01)
os.write(2, f"{longest * 1000:.1f} {lines}\n".encode())
"""


def test_a_stalled_reader_of_kvwatchs_output_never_makes_the_engine_wait() -> None:
    # kvwatch's stdout is a pipe nobody reads (a stuck journald, a paused container runtime):
    # the engine must go on writing without waiting, what did not fit is dropped and counted.
    out_read, out_write = os.pipe()
    stdout = os.fdopen(out_write, "wb")
    sink = LogSink(stdout, max_bytes=1 << 20)
    proc = subprocess.Popen([sys.executable, "-c", _LOGGER, "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    pump = OutputPump("e", proc.stdout.fileno(), sink).start()
    try:
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
        longest_ms, written = float(err.split()[0]), int(err.split()[1])
        assert longest_ms < 100, longest_ms            # the engine never waited on kvwatch's reader
        assert written > 20_000
        assert eventually(lambda: pump.lines_seen == written, 10)     # the diagnosis saw every line
        assert sink.lines_dropped > written // 2       # ~6 MB offered, ~1 MiB held: the rest counted
        reader = threading.Thread(target=lambda: _drain_into(out_read, received), daemon=True)
        received: list[bytes] = []
        reader.start()                                  # the reader wakes up: the stream says what it missed
        assert pump.join(timeout=10)
        sink.close(timeout=10)
        stdout.close()
        reader.join(timeout=10)
        text = b"".join(received)
        assert f"[kvwatch] {sink.lines_dropped} engine log lines dropped".encode() in text
    finally:
        proc.kill()
        proc.stdout.close()
        proc.stderr.close()


def _drain_into(fd: int, into: list[bytes]) -> None:
    while chunk := os.read(fd, 1 << 20):
        into.append(chunk)
    os.close(fd)


def test_the_lines_kvwatchs_stdout_dropped_reach_kvwatchs_own_metrics() -> None:
    from types import SimpleNamespace

    from exporter_support import render

    from kvwatch.commands.run import _WithLogDrops
    from kvwatch.engine_status import EngineState, EngineStatus
    from kvwatch.exporter.snapshot import EngineSnapshot, WatchSnapshot

    sink = LogSink(io.BytesIO(), max_bytes=10)
    sink.write(b"a line longer than ten bytes\nand another\n")     # does not fit: dropped, counted
    supervisor = SimpleNamespace(status=EngineStatus(name="e", state=EngineState.READY))
    status = _WithLogDrops(supervisor, sink).status   # type: ignore[arg-type]
    assert status.log_lines_dropped == 2
    page = render(WatchSnapshot(taken_at=1.0, engines=(EngineSnapshot(status, up=True),)))
    assert 'kvwatch_engine_log_lines_dropped_total{engine="e"} 2.0' in page
    sink.close()


def test_catch_up_reads_what_was_written_and_lines_before_leaves_out_what_came_later() -> None:
    """kvwatch marks the engine's output before its own stop signal: the lines written before are all read
    by then (the pipe left empty), and the lines after the mark are left out of lines_before."""
    read_fd, write_fd = os.pipe()
    pump = OutputPump("e", read_fd, None).start()
    os.write(write_fd, b"".join(b"before %d\n" % i for i in range(500)))
    mark = pump.catch_up(5.0)
    assert mark == 500
    os.write(write_fd, b"ERROR after the stop signal\n")
    os.close(write_fd)
    assert pump.join(5)
    os.close(read_fd)
    before = pump.lines_before(mark)
    assert before[0] == "before 0" and before[-1] == "before 499" and len(before) == 500
    assert pump.lines()[-1] == "ERROR after the stop signal"
    assert pump.lines_before(pump.lines_seen) == pump.lines()
