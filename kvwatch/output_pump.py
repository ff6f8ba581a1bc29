"""Drain the engine's output so it never blocks on a full pipe; keep the tail for diagnosis.

One thread per engine reads the pipe (stdout and stderr share it) in large binary
chunks and splits lines itself: invalid UTF-8 is replaced, a line longer than
`max_line` is cut into pieces rather than buffered without bound. Each line goes to
kvwatch's own output prefixed with the engine name, into a ring buffer of the last
`ring_lines` lines, and through the startup-line parser (VLLM_FACTS §5).
"""
from __future__ import annotations

import logging
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO

_LOG = logging.getLogger(__name__)

_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_KV_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_MODEL_LOADING = re.compile(r"Model loading took ([\d.]+) GiB memory")
_GiB = 2**30


@dataclass(frozen=True)
class LogFacts:
    """What the engine told about its KV cache at startup; None until it said so."""

    kv_tokens: int | None = None
    available_kv_bytes: int | None = None
    model_loading_bytes: int | None = None


def parse_fact(line: str, facts: LogFacts) -> LogFacts:
    """The facts after one more line (pure)."""
    if "KV cache" not in line and "Model loading" not in line:
        return facts
    if m := _KV_TOKENS.search(line):
        return LogFacts(int(m.group(1).replace(",", "")), facts.available_kv_bytes, facts.model_loading_bytes)
    if m := _KV_AVAILABLE.search(line):
        return LogFacts(facts.kv_tokens, int(float(m.group(1)) * _GiB), facts.model_loading_bytes)
    if m := _MODEL_LOADING.search(line):
        return LogFacts(facts.kv_tokens, facts.available_kv_bytes, int(float(m.group(1)) * _GiB))
    return facts


# The access-log lines of kvwatch's own /health and /metrics probes (one a second while starting)
# would drown the engine's log: they stay in the ring buffer but are not passed through. kvwatch
# probes over loopback; a scrape from another host (Prometheus reading the engine) still shows.
_PROBE_MARKERS = (b'"GET /health HTTP/1.1" 200', b'"GET /metrics HTTP/1.1" 200')
_LOOPBACK = (b" 127.0.0.1:", b" [::1]:", b" ::1:")


def _own_probe(raw: bytes) -> bool:
    return (b'"GET /' in raw and any(marker in raw for marker in _PROBE_MARKERS)
            and any(source in raw for source in _LOOPBACK))


class OutputPump:
    def __init__(self, name: str, fd: int, sink: BinaryIO | None, *, ring_lines: int = 5000,
                 max_line: int = 64 * 1024, chunk: int = 1 << 20) -> None:
        self.name = name
        self._fd = fd
        self._sink = sink
        self._prefix = f"[{name}] ".encode()
        self._ring: deque[str] = deque(maxlen=ring_lines)
        self._lock = threading.Lock()
        self._max_line = max_line
        self._chunk = chunk
        self._facts = LogFacts()
        self.lines_seen = 0
        self.bytes_seen = 0
        self._thread = threading.Thread(target=self._run, name=f"pump-{name}", daemon=True)

    def start(self) -> "OutputPump":
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
        with self._lock:
            return list(self._ring)

    def lines_since(self, seen: int) -> list[str]:
        """The lines after the first `seen` ones (as far as the ring still holds them)."""
        with self._lock:
            newer = self.lines_seen - seen
            if newer <= 0:
                return []
            ring = list(self._ring)
        return ring[-newer:] if newer < len(ring) else ring

    # -- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        pending = b""
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
                *complete, pending = pending.split(b"\n")
                if len(pending) > self._max_line:  # a giant line: cut it, never buffer it all
                    complete.append(pending)
                    pending = b""
                if complete:
                    self._emit(self._cut(complete))
            if pending:
                self._emit(self._cut([pending]))
        except Exception:  # the pump must never die silently: the engine would block on its pipe
            _LOG.exception("pump %s: failed", self.name)

    def _cut(self, raw_lines: list[bytes]) -> list[bytes]:
        """Lines longer than max_line become several: the ring holds lines, not megabytes."""
        size = self._max_line
        if all(len(raw) <= size for raw in raw_lines):
            return raw_lines
        out: list[bytes] = []
        for raw in raw_lines:
            out.extend(raw[i:i + size] for i in range(0, len(raw), size)) if len(raw) > size else out.append(raw)
        return out

    def _emit(self, raw_lines: list[bytes]) -> None:
        texts = [raw.rstrip(b"\r").decode("utf-8", "replace") for raw in raw_lines]
        facts = self._facts
        for text in texts:
            facts = parse_fact(text, facts)
        self._facts = facts
        with self._lock:
            self._ring.extend(texts)
            self.lines_seen += len(texts)
        if self._sink is not None:
            out = b"".join(self._prefix + raw.rstrip(b"\r") + b"\n" for raw in raw_lines
                           if not _own_probe(raw))
            try:
                self._sink.write(out)
                self._sink.flush()
            except (OSError, ValueError) as exc:  # kvwatch's stdout closed: keep draining
                _LOG.warning("pump %s: passthrough off: %s", self.name, exc)
                self._sink = None
