"""Drain the engine's output so it never blocks on a full pipe; keep the tail for diagnosis.

One thread per engine reads the pipe (stdout and stderr share it) in large binary chunks.
Every line goes to kvwatch's own output prefixed with the engine name; the raw tail (the
last `ring_bytes`) is kept for diagnosis and kvwatch.diagnosis.startup_lines reads the
lines that carry a fact (docs/vllm-facts.md §5: the KV cache size, where the GPU memory went). A line without a newline is cut after `max_line` bytes rather
than buffered without bound. The tail becomes text lines only when someone asks for them
(a failure): invalid UTF-8 is replaced, carriage returns dropped, giant lines cut.

Passing the lines on never makes the engine wait on whoever reads kvwatch's own output (journald,
a container runtime, a pipe that stopped being read): a LogSink holds what is to be written, at
most `max_bytes`, and its own thread writes it; what does not fit is dropped and counted
(`kvwatch_engine_log_lines_dropped_total`). The tail for diagnosis keeps every line regardless.
"""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import termios
import threading
import time
from collections import deque
from typing import BinaryIO

from kvwatch.diagnosis.startup_lines import FACT_MARKERS, LogFacts, parse_fact

_LOG = logging.getLogger(__name__)

# A reader blocked on the pipe costs the engine a wake-up of that reader for each line it writes:
# on a small host that halves a fast logger's throughput (bench/bench_log_pump.py). So after a
# read that took less than half the pipe the pump sleeps a moment instead of waiting on it; the
# pipe (1 MiB, enlarged by spawn.spawn) takes the lines meanwhile without waking anyone, and
# the next read takes them all at once. Longer pauses measured worse: the pipe's pages go cold.
# A line reaches the tail at most ~1 ms later; nothing kvwatch does is that time-critical.
_BATCH_PAUSE_S = 0.001

_FACT_MARKERS_RAW = tuple(marker.encode() for marker in FACT_MARKERS)


# The access-log lines of kvwatch's own /health and /metrics probes (one a second while starting)
# would drown the engine's log: they stay in the tail but are not passed through. kvwatch
# probes over loopback; a scrape from another host (Prometheus reading the engine) still shows.
_PROBE_MARKERS = (b'"GET /health HTTP/1.1" 200', b'"GET /metrics HTTP/1.1" 200')
_LOOPBACK = (b" 127.0.0.1:", b" [::1]:", b" ::1:")


def _unread(fd: int) -> int:
    """Bytes written to the pipe and not read yet (0 when the fd is closed or not a pipe)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _pipe_capacity(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (OSError, AttributeError):  # not a pipe, or not Linux
        return 64 * 1024


class LogSink:
    """A writer that never blocks its caller: blocks queue (at most `max_bytes`) for a thread of
    its own that writes them to `target`. A block that does not fit is dropped whole and its
    lines counted; kvwatch says once on its own log that it is dropping, and in the stream how
    many lines went missing once the reader catches up. One per kvwatch process (every relaunch
    of the engine writes through it), so `lines_dropped` only grows."""

    def __init__(self, target: BinaryIO, *, max_bytes: int = 8 << 20) -> None:
        self._target: BinaryIO | None = target
        self._max_bytes = max_bytes
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._closed = False
        self._writing = False
        self._unreported = 0            # lines dropped since the stream last said so
        self.lines_dropped = 0
        self.bytes_dropped = 0
        self._thread = threading.Thread(target=self._run, name="log-sink", daemon=True)
        self._thread.start()

    def write(self, block: bytes) -> None:
        """Queue `block` (whole lines, each ending in a newline); never waits on the target."""
        with self._cond:
            if self._target is None or self._closed:
                return
            if self._queued + len(block) > self._max_bytes:
                lines = block.count(b"\n") or 1
                if not self.lines_dropped:
                    _LOG.warning("kvwatch's output is not being read: dropping the engine's lines "
                                 "(counted in kvwatch_engine_log_lines_dropped_total); the engine does not wait")
                self.lines_dropped += lines
                self.bytes_dropped += len(block)
                self._unreported += lines
                return
            self._queue.append(block)
            self._queued += len(block)
            self._cond.notify()

    def flush(self) -> None:
        """Nothing to do at once: the thread flushes after each write (kept for BinaryIO's shape)."""

    def drain(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds for what is queued to be written. True when it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._writing) and self._target is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued (for at most `timeout` seconds), then stop the thread."""
        self.drain(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                blocks = list(self._queue)
                self._queue.clear()
                self._queued = 0
                note = self._unreported
                self._unreported = 0
                self._writing = True
            if note:
                blocks.insert(0, f"[kvwatch] {note} engine log lines dropped: kvwatch's output "
                                 f"was not being read\n".encode())
            try:
                target = self._target
                if target is not None:
                    target.write(b"".join(blocks))
                    target.flush()
            except (OSError, ValueError) as exc:  # kvwatch's stdout closed: the engine goes on
                _LOG.warning("log sink: passthrough off: %s", exc)
                self._target = None
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()


def _own_probe(raw: bytes) -> bool:
    return (b'"GET /' in raw and any(marker in raw for marker in _PROBE_MARKERS)
            and any(source in raw for source in _LOOPBACK))


class OutputPump:
    def __init__(self, name: str, fd: int, sink: BinaryIO | LogSink | None, *, ring_lines: int = 5000,
                 ring_bytes: int = 4 << 20, max_line: int = 64 * 1024, chunk: int = 1 << 20) -> None:
        self.name = name
        self._fd = fd
        # A plain file gets a LogSink of the pump's own (written out at EOF): no sink blocks the pump.
        self._own_sink = sink is not None and not isinstance(sink, LogSink)
        self._sink: LogSink | None = LogSink(sink) if sink is not None and not isinstance(sink, LogSink) else sink
        self._prefix = f"[{name}] ".encode()
        self._newline_prefix = b"\n" + self._prefix
        # The tail as the blocks read (whole lines each): a busy engine writes ~6k lines per MB,
        # and making a Python object of each would take a core away from it on a small host.
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._ring_bytes = ring_bytes
        self._ring_lines = ring_lines
        self._lock = threading.Lock()
        self._max_line = max_line
        self._chunk = chunk
        self._facts = LogFacts()
        self.lines_seen = 0  # lines read, a line cut for length counting once
        self.bytes_seen = 0
        self._thread = threading.Thread(target=self._run, name=f"pump-{name}", daemon=True)

    def start(self) -> OutputPump:
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> bool:
        """Wait for EOF (every writer of the pipe gone). True when the pump finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def facts(self) -> LogFacts:
        return self._facts  # an immutable value swapped atomically: no lock needed

    def lines(self) -> list[str]:
        """The last lines (at most ring_lines) as text."""
        return self._texts(self._tail_lines()[1])

    def lines_since(self, seen: int) -> list[str]:
        """The lines after the first `seen` ones (as far as the tail still holds them)."""
        count, raw_lines = self._tail_lines()
        newer = count - seen
        return self._texts(raw_lines[-newer:]) if newer > 0 else []

    def lines_before(self, count: int) -> list[str]:
        """The lines among the first `count` seen (as far as the tail still holds them): what the
        engine said before a moment kvwatch marked, without what it said after."""
        seen, raw_lines = self._tail_lines()
        later = seen - count
        return self._texts(raw_lines[:-later] if later > 0 else raw_lines)

    def catch_up(self, timeout: float) -> int:
        """Wait (at most `timeout` s) until nothing written to the pipe is left unread: the count of
        lines seen then. What the engine wrote before this call is read by then."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and _unread(self._fd) > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(_BATCH_PAUSE_S * 2)   # the last read's block handed on
        return self.lines_seen

    def _tail_lines(self) -> tuple[int, list[bytes]]:
        """The count of lines seen and the tail's raw lines, read together under the lock."""
        with self._lock:
            seen = self.lines_seen
            tail = b"\n".join(self._tail)
        return seen, tail.split(b"\n") if tail else []

    def _texts(self, raw_lines: list[bytes]) -> list[str]:
        size = self._max_line
        texts: list[str] = []
        for raw in raw_lines[-self._ring_lines:]:  # a cut line only adds lines: these are enough
            text = raw.rstrip(b"\r").decode("utf-8", "replace")
            if len(raw) > size:  # the tail holds lines, not megabytes
                texts.extend(text[i:i + size] for i in range(0, len(text), size))
            else:
                texts.append(text)
        return texts[-self._ring_lines:]

    # -- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        pending = b""
        sleep_below = _pipe_capacity(self._fd) // 2  # a read as big as that: the engine is pouring
        try:
            while True:
                try:
                    data = os.read(self._fd, self._chunk)
                except InterruptedError:
                    continue
                except OSError as exc:  # EBADF after close(): the engine is being discarded
                    _LOG.debug("pump %s: read ended: %s", self.name, exc)
                    break
                if not data:
                    break
                self.bytes_seen += len(data)
                pending += data
                end = pending.rfind(b"\n")
                if end >= 0:
                    self._emit(pending[:end])
                    pending = pending[end + 1:]
                if len(pending) > self._max_line:  # a giant line: cut it, never buffer it all
                    self._emit(pending)
                    pending = b""
                if len(data) < sleep_below:
                    time.sleep(_BATCH_PAUSE_S)
            if pending:
                self._emit(pending)
            if self._own_sink and self._sink is not None:
                self._sink.close(timeout=5.0)
        except Exception:  # the pump must never die silently: the engine would block on its pipe
            _LOG.exception("pump %s: failed", self.name)

    def _emit(self, block: bytes) -> None:
        """Hand on `block`: whole lines joined by newlines (no final one). Only bytes methods
        run over the whole block; Python loops over its lines only where a line matters."""
        # Every fact comes before vLLM's "init engine ... took" line: after it, no block is searched.
        # Until then (the CUDA graph line comes after the KV cache size) a block costs a few
        # substring searches; only a block that holds a marker is split into lines.
        if not self._facts.started and any(marker in block for marker in _FACT_MARKERS_RAW):
            facts = self._facts
            for raw in block.split(b"\n"):
                if any(marker in raw for marker in _FACT_MARKERS_RAW):
                    try:
                        facts = parse_fact(raw.decode("utf-8", "replace"), facts)
                    except (ValueError, OverflowError):   # a line that only looks like one: keep draining
                        _LOG.debug("pump %s: unreadable fact line %r", self.name, raw[:200])
            self._facts = facts
        with self._lock:
            self._tail.append(block)
            self._tail_bytes += len(block)
            while self._tail_bytes - len(self._tail[0]) >= self._ring_bytes:
                self._tail_bytes -= len(self._tail.popleft())
            self.lines_seen += block.count(b"\n") + 1
        if self._sink is not None:
            self._pass_through(self._sink, block)

    def _pass_through(self, sink: LogSink, block: bytes) -> None:
        if b"\r" in block or b'"GET /' in block:  # rare: progress bars, HTTP access lines
            raw_lines = [raw.rstrip(b"\r") for raw in block.split(b"\n") if not _own_probe(raw)]
            if not raw_lines:
                return
            block = b"\n".join(raw_lines)
        sink.write(self._prefix + block.replace(b"\n", self._newline_prefix) + b"\n")
