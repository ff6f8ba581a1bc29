"""The engine boundary over HTTP: the only kvwatch module that talks to vLLM's /health and /metrics.

Nothing here raises to callers: an unreachable engine, an HTTP error or a page that
is not Prometheus text comes back as ``EngineMetrics.failed(reason)`` (and
``health`` as False). Pages are parsed with prometheus_client's own parser, but for the plain
sample lines vLLM writes (sample_lines.py).
Requests go straight to the engine: proxy variables in the environment are ignored,
redirects are not followed (a redirect is not the engine's page), and every exchange has one
deadline for the whole of it (connect, request, headers, body) and a body size limit, so an
engine that drips bytes cannot hold the watch loop or the watchdog.

A page is bounded in what is kept of it too, not only in size: only the lines of the series
kvwatch reads are decoded and parsed, each at most MAX_LINE_BYTES (4 KiB), at most
MAX_SERIES_PER_FAMILY of each; a label value that would become one of kvwatch's own (the rank,
the cache dtype) at most MAX_LABEL_CHARS; at most MAX_RANKS ranks. So 100,000 series or labels
of 10 KB cost kvwatch a bounded parse, a bounded snapshot and a bounded /metrics page of its own.
"""
from __future__ import annotations

import http.client
import io
import logging
import math
import re
import socket
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvwatch.boundary.sample_lines import plain_samples
from kvwatch.vllm_releases.metrics import kv_usage_names

_LOG = logging.getLogger(__name__)

MAX_PAGE_BYTES = 16 << 20  # a vLLM page is ~60 KB; anything this large is not one
MAX_LINE_BYTES = 4 << 10   # vllm:cache_config_info, the longest line kvwatch reads, is ~1 KB
MAX_SERIES_PER_FAMILY = 512   # one series per rank (and model) of each family kvwatch reads
MAX_LABEL_CHARS = 64       # vLLM's engine label is a rank index, its cache_dtype a dtype name
MAX_RANKS = 256            # the `rank` label values kvwatch exports (each rank ~20 series of its own)
_MAX_HEAD_LINES = 2000     # a page without the series kvwatch reads is checked this far (vLLM's: ~600)
HEALTH_MAX_BYTES = 64 << 10

CACHE_CONFIG = "vllm:cache_config_info"
# The KV cache usage series of every release kvwatch knows, newest name first (vllm_releases/metrics.py).
KV_USAGE_NAMES = kv_usage_names()
KV_USAGE = KV_USAGE_NAMES[0]
# The engine's load: summed over its ranks, read for progress (watchdog/progress.py); Prometheus
# scrapes these series from the engine as they are, kvwatch does not re-export them.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
_LOAD = (RUNNING, WAITING, PROMPT_TOKENS, GENERATION_TOKENS, PREEMPTIONS)
# Finished requests' lengths: histograms with 1-2-5 buckets up to max-model-len (vLLM 0.32,
# vllm/v1/metrics/loggers.py:865 and vllm/v1/metrics/buckets.py:195).
REQUEST_PROMPT = "vllm:request_prompt_tokens"
REQUEST_GENERATION = "vllm:request_generation_tokens"
_LENGTHS = tuple(f"{h}_{part}" for h in (REQUEST_PROMPT, REQUEST_GENERATION) for part in ("sum", "count", "bucket"))
# Only the series kvwatch reads.
_WANTED = (CACHE_CONFIG, *KV_USAGE_NAMES, *_LOAD, *_LENGTHS)
# A line of one of them, found without splitting the page: group 1 is the line, group 2 says which.
# It is sought after a newline (the page gets one in front): a literal first character lets the regex
# engine skip ahead, 4x faster than ^ in multi-line mode.
_WANTED_LINE = re.compile(rb"\n((" + b"|".join(re.escape(name.encode()) for name in _WANTED) + rb")[^\n]*)")


@dataclass(frozen=True)
class CacheConfig:
    """The labels of ``vllm:cache_config_info`` kvwatch uses; None where vLLM says "None" or omits it."""

    num_gpu_blocks: int | None
    block_size: int | None
    cache_dtype: str | None
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None
    kv_cache_size_tokens: int | None


@dataclass(frozen=True)
class RankMetrics:
    """One data-parallel rank's series: vLLM labels each engine core's with ``engine`` (its DP index)."""

    rank: str
    cache: CacheConfig | None
    kv_cache_usage_ratio: float | None


@dataclass(frozen=True)
class EngineLoad:
    """The engine's request and token series, summed over its ranks; None where it has none."""

    running: float | None = None
    waiting: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    preemptions: float | None = None
    request_tokens: float | None = None       # prompt + generated tokens of every finished request
    requests: float | None = None             # finished requests
    prompt_buckets: tuple[tuple[float, float], ...] = ()       # (le, cumulative count), le ascending
    generation_buckets: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape of an engine's /metrics. ``ok`` False: ``error`` says why and the rest is None."""

    ok: bool
    error: str | None = None
    cache: CacheConfig | None = None
    kv_cache_usage_ratio: float | None = None   # vllm:kv_cache_usage_perc (already 0..1)
    ranks: tuple[RankMetrics, ...] = ()         # per engine core (DP rank), in rank order
    load: EngineLoad = EngineLoad()

    @staticmethod
    def failed(error: str) -> EngineMetrics:
        return EngineMetrics(False, error)


@dataclass(frozen=True)
class EnginePage:
    """The last look at a running engine: whether /health answered and its /metrics as read (None: not
    read that time). Under `kvwatch run` the supervisor takes it and the exporter exports it, so the
    engine is read once per interval, not once by each."""

    up: bool
    metrics: EngineMetrics | None = None


def _url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


class _PageTooLarge(Exception):
    pass


class _DeadlineSocket:
    """A socket whose every operation gets only the time left before one deadline: a peer that
    sends a byte every so often cannot stretch a request past it (a per-read timeout would)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        # as socket.makefile does: the socket really closes only once its files are closed too
        self._sock._io_refs += 1  # type: ignore[attr-defined]
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:       # close, _decref_socketios, ... of the real socket
        return getattr(self._sock, name)


def fetch(url: str, timeout: float, max_bytes: int) -> tuple[int, bytes]:
    """GET `url`: (status, body). The whole exchange ends by `timeout` seconds (TimeoutError), a
    body over `max_bytes` raises _PageTooLarge; no redirect is followed, no proxy used."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    deadline = time.monotonic() + timeout
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.connect()
        conn.sock = _DeadlineSocket(conn.sock, deadline)  # type: ignore[assignment]
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "text/plain", "Connection": "close"})
        resp = conn.getresponse()
        body = resp.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise _PageTooLarge(f"page larger than {max_bytes} bytes")
        return resp.status, body
    finally:
        conn.close()


def health(base_url: str, timeout: float = 2.0) -> bool:
    """True when GET /health answers 200 within ``timeout`` seconds (the whole exchange)."""
    try:
        status, _ = fetch(_url(base_url, "/health"), timeout, HEALTH_MAX_BYTES)
        return status == 200
    except (OSError, ValueError, http.client.HTTPException, _PageTooLarge) as exc:
        _LOG.debug("%s/health: %s", base_url, exc)
        return False


def scrape(base_url: str, timeout: float = 3.0) -> EngineMetrics:
    """GET /metrics and parse it; every failure is an ``EngineMetrics.failed`` value."""
    url = _url(base_url, "/metrics")
    try:
        status, body = fetch(url, timeout, MAX_PAGE_BYTES)
    except _PageTooLarge:
        return EngineMetrics.failed(f"{url}: page larger than {MAX_PAGE_BYTES} bytes")
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # timeouts (the whole exchange), resets, a malformed URL, a peer that does not speak HTTP
        return EngineMetrics.failed(f"{url}: {type(exc).__name__}: {exc}"[:300])
    if status != 200:
        return EngineMetrics.failed(f"{url}: HTTP {status}")
    return parse_page(body)


def parse_metrics(text: str) -> EngineMetrics:
    """parse_page of a page given as text. Pure."""
    return parse_page(text.encode("utf-8", "surrogatepass"))


def _kept_lines(page: bytes) -> bytes:
    """The lines of the series kvwatch reads (a page is ~600 lines, mostly histograms: 20x faster
    to parse), bounded in length and in number per family; b"" when there is none."""
    kept: list[bytes] = []
    counts: dict[bytes, int] = {}
    for match in _WANTED_LINE.finditer(b"\n" + page):
        line, name = match.groups()
        if len(line) > MAX_LINE_BYTES:
            continue
        if counts.get(name, 0) < MAX_SERIES_PER_FAMILY:
            counts[name] = counts.get(name, 0) + 1
            kept.append(line)
    return b"\n".join(kept) + b"\n" if kept else b""


def _head(page: bytes) -> bytes:
    """The page's first _MAX_HEAD_LINES lines (the whole page when it is shorter)."""
    end = -1
    for _ in range(_MAX_HEAD_LINES):
        end = page.find(b"\n", end + 1)
        if end < 0:
            return page
    return page[:end + 1]


def parse_page(page: bytes) -> EngineMetrics:
    """Parse a vLLM /metrics page (Prometheus text format, UTF-8). Pure.

    With data parallelism vLLM exports one series per engine index (label ``engine``):
    usage is the fullest engine's, and the cache
    config is engine "0"'s (its num_gpu_blocks is already the sum over DP engines).
    ``ranks`` keeps each engine's cache config and usage apart.
    """
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    vllm_seen = False
    # Only the lines kvwatch reads are parsed. A page without them, or one that does not end in a
    # newline (a cut page), is parsed from its head instead, so that it still gets the parser's
    # error (a page of a million other series costs no more than its first lines).
    kept = _kept_lines(page) if page.endswith(b"\n") else b""
    try:
        text = (kept or _head(page)).decode("utf-8")
    except UnicodeDecodeError:
        return EngineMetrics.failed("page is not UTF-8")
    # vLLM's lines are plain (sample_lines.py): read without prometheus_client's slow parser.
    plain = plain_samples(text, _WANTED) if kept else None
    if plain is not None:
        samples, vllm_seen = plain, True   # every kept line is a vllm: series
    else:
        try:
            for family in text_string_to_metric_families(text):
                vllm_seen = vllm_seen or family.name.startswith("vllm:")
                for sample in family.samples:
                    if sample.name in _WANTED:
                        samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
        except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
            return EngineMetrics.failed(f"not Prometheus text: {type(exc).__name__}: {exc}"[:300])
    if not vllm_seen:
        return EngineMetrics.failed("no vllm: metrics on the page")
    usage = [v for _, v in _kv_usage(samples) if math.isfinite(v)]
    return EngineMetrics(
        ranks=_ranks(samples),
        ok=True,
        cache=_cache_config(samples.get(CACHE_CONFIG, [])),
        kv_cache_usage_ratio=max(usage) if usage else None,
        load=_load(samples),
    )


def _load(samples: dict[str, list[tuple[dict[str, str], float]]]) -> EngineLoad:
    sums = [_summed(samples.get(f"{h}_sum", ())) for h in (REQUEST_PROMPT, REQUEST_GENERATION)]
    running, waiting, prompt, generation, preemptions = (_summed(samples.get(name, ())) for name in _LOAD)
    return EngineLoad(
        running, waiting, prompt, generation, preemptions,
        request_tokens=sum(v for v in sums if v is not None) if any(v is not None for v in sums) else None,
        requests=_summed(samples.get(f"{REQUEST_PROMPT}_count", ())),
        prompt_buckets=_buckets(samples.get(f"{REQUEST_PROMPT}_bucket", ())),
        generation_buckets=_buckets(samples.get(f"{REQUEST_GENERATION}_bucket", ())),
    )


_MAX_BUCKETS = 64   # vLLM's 1-2-5 series to 10 M tokens has 21


def _buckets(series: Iterable[tuple[dict[str, str], float]]) -> tuple[tuple[float, float], ...]:
    """A histogram's cumulative counts by bound, summed over its series (ranks, models)."""
    counts: dict[float, float] = {}
    for labels, value in series:
        le = _float(labels.get("le"))
        if le is not None and math.isfinite(value) and (le in counts or len(counts) < _MAX_BUCKETS):
            counts[le] = counts.get(le, 0.0) + value
    return tuple(sorted(counts.items()))


def _summed(series: Iterable[tuple[dict[str, str], float]]) -> float | None:
    values = [v for _, v in series if math.isfinite(v)]
    return sum(values) if values else None


def _rank_key(rank: str) -> tuple[int, str]:
    return (len(rank), rank)


def _kv_usage(samples: dict[str, list[tuple[dict[str, str], float]]]) -> list[tuple[dict[str, str], float]]:
    """The KV cache usage series the page has, by the newest name it exports (0.10 exports both)."""
    return next((samples[name] for name in KV_USAGE_NAMES if samples.get(name)), [])


def _ranks(samples: dict[str, list[tuple[dict[str, str], float]]]) -> tuple[RankMetrics, ...]:
    caches: dict[str, CacheConfig | None] = {}
    for labels, _ in samples.get(CACHE_CONFIG, ()):
        rank = labels.get("engine", "0")
        if len(rank) <= MAX_LABEL_CHARS:   # it becomes kvwatch's own `rank` label
            caches.setdefault(rank, _cache_config([(labels, 1.0)]))
    usage: dict[str, float] = {}
    for labels, value in _kv_usage(samples):
        rank = labels.get("engine", "0")
        if math.isfinite(value) and len(rank) <= MAX_LABEL_CHARS:
            usage[rank] = max(value, usage.get(rank, value))
    ranks = sorted(set(caches) | set(usage), key=_rank_key)[:MAX_RANKS]
    return tuple(RankMetrics(r, caches.get(r), usage.get(r)) for r in ranks)


def _cache_config(series: list[tuple[dict[str, str], float]]) -> CacheConfig | None:
    if not series:
        return None
    # engine "0" first: the shortest index string, then the smallest
    labels = min(series, key=lambda s: (len(s[0].get("engine", "")), s[0].get("engine", ""),
                                        sorted(s[0].items())))[0]
    return CacheConfig(
        num_gpu_blocks=_int(labels.get("num_gpu_blocks")),
        block_size=_int(labels.get("block_size")),
        cache_dtype=_short(labels.get("cache_dtype")),
        gpu_memory_utilization=_float(labels.get("gpu_memory_utilization")),
        kv_cache_memory_bytes=_int(labels.get("kv_cache_memory_bytes")),
        kv_cache_size_tokens=_int(labels.get("kv_cache_size_tokens")),
    )


def _short(text: str | None) -> str | None:
    """A label value kvwatch may take into a label of its own: None when empty or too long."""
    return text if text and len(text) <= MAX_LABEL_CHARS else None


def _int(text: str | None) -> int | None:
    if text is None or text in ("", "None"):
        return None
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    return value if value >= 0 else None


def _float(text: str | None) -> float | None:
    if text is None or text in ("", "None"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
