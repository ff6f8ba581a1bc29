"""kvwatch.boundary.engine_http against /metrics pages captured from the real vLLM CPU engine
(tests/fixtures/metrics/capture_cpu_metrics.py), served over real HTTP where HTTP matters."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_standin import Route, serve_routes
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.boundary import engine_http
from kvwatch.boundary.engine_http import CacheConfig, EngineMetrics, parse_metrics

METRICS = Path(__file__).parent / "fixtures" / "metrics"
DEFAULT_PAGE = (METRICS / "cpu_default.txt").read_text()


def test_parses_the_real_cpu_engine_page() -> None:
    m = parse_metrics(DEFAULT_PAGE)
    assert m.ok and m.error is None
    # 2 layers x 128 tokens x 2 heads x 2 x 32 x 2 B = 65,536 B per block; 1 GiB -> 16,384 blocks
    assert m.cache == CacheConfig(num_gpu_blocks=16384, block_size=128, cache_dtype="auto",
                                  gpu_memory_utilization=0.92, kv_cache_memory_bytes=1 << 30,
                                  kv_cache_size_tokens=2_097_152)
    assert m.kv_cache_usage_ratio == 0.0


def test_parses_the_page_after_a_request() -> None:
    m = parse_metrics((METRICS / "cpu_default_after_request.txt").read_text())
    assert m.ok and m.cache is not None and m.cache.num_gpu_blocks == 16384
    assert m.kv_cache_usage_ratio is not None and 0.0 <= m.kv_cache_usage_ratio <= 1.0


def test_parses_the_block_size_the_engine_was_given() -> None:
    m = parse_metrics((METRICS / "cpu_block64.txt").read_text())
    assert m.ok and m.cache is not None
    assert (m.cache.block_size, m.cache.cache_dtype, m.cache.num_gpu_blocks) == (64, "auto", 21845)


def test_data_parallel_engines_the_fullest_usage_wins() -> None:
    lines = []
    for line in DEFAULT_PAGE.splitlines():
        lines.append(line)
        if line.startswith("vllm:kv_cache_usage_perc{"):
            lines.append(line.replace('engine="0"', 'engine="1"').replace(" 0.0", " 0.75"))
    m = parse_metrics("\n".join(lines) + "\n")
    assert m.ok
    assert m.kv_cache_usage_ratio == 0.75
    assert [(r.rank, r.kv_cache_usage_ratio) for r in m.ranks] == [("0", 0.0), ("1", 0.75)]
    assert m.cache is not None and m.cache.num_gpu_blocks == 16384


@pytest.mark.parametrize("text,why", [
    ("", "no vllm: metrics"),
    ("# HELP python_info x\n# TYPE python_info gauge\npython_info 1\n", "no vllm: metrics"),
    ("<html><body>502 Bad Gateway</body></html>", "not Prometheus text"),
    ('vllm:num_requests_running{engine="0" 1\n', "not Prometheus text"),
    ("vllm:kv_cache_usage_perc one\n", "not Prometheus text"),
    (DEFAULT_PAGE[: len(DEFAULT_PAGE) // 2] + "\x00\x01garbage{{{", "not Prometheus text"),
])
def test_garbage_is_an_error_value(text: str, why: str) -> None:
    m = parse_metrics(text)
    assert not m.ok and m.cache is None and why in (m.error or "")


def test_missing_and_none_labels_are_not_available() -> None:
    page = ('# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="0",num_gpu_blocks="None",'
            'gpu_memory_utilization="0.9",kv_cache_memory_bytes="None"} 1.0\n')
    m = parse_metrics(page)
    assert m.ok and m.cache == CacheConfig(None, 16, "fp8", 0.9, None, None)
    assert m.kv_cache_usage_ratio is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_text_gives_a_value_never_an_exception(text: str) -> None:
    m = parse_metrics(text)
    assert isinstance(m, EngineMetrics) and (m.ok or m.error)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(DEFAULT_PAGE)), st.binary(max_size=40))
def test_a_damaged_real_page_gives_a_value(cut: int, noise: bytes) -> None:
    m = parse_metrics(DEFAULT_PAGE[:cut] + noise.decode("latin-1") + DEFAULT_PAGE[cut:])
    assert isinstance(m, EngineMetrics) and (m.ok or m.error)


# -- over HTTP ---------------------------------------------------------------------

@pytest.fixture
def engine() -> Iterator[tuple[str, dict[str, Route]]]:
    routes: dict[str, Route] = {}
    with serve_routes(routes) as url:
        yield url, routes


def test_scrape_and_health_over_http(engine) -> None:
    url, routes = engine
    routes["/metrics"] = (200, DEFAULT_PAGE.encode(), 0.0)
    routes["/health"] = (200, b"", 0.0)
    assert engine_http.health(url, 2)
    m = engine_http.scrape(url + "/", 2)  # a trailing slash on the base URL is fine
    assert m.ok and m.cache is not None and m.cache.num_gpu_blocks == 16384


def test_http_errors_are_error_values(engine) -> None:
    url, routes = engine
    routes["/health"] = (503, b"", 0.0)
    routes["/metrics"] = (500, b"boom", 0.0)
    assert engine_http.health(url, 2) is False
    m = engine_http.scrape(url, 2)
    assert not m.ok and "HTTP 500" in (m.error or "")
    routes["/metrics"] = (200, b"\xff\xfe\x00garbage", 0.0)
    m = engine_http.scrape(url, 2)
    assert not m.ok and "UTF-8" in (m.error or "")


def test_a_hung_engine_times_out(engine) -> None:
    url, routes = engine
    routes["/metrics"] = (200, DEFAULT_PAGE.encode(), 3.0)
    routes["/health"] = (200, b"", 3.0)
    m = engine_http.scrape(url, 0.3)   # how long it takes: bench/bench_deadlines.py
    assert not m.ok and m.error
    assert engine_http.health(url, 0.3) is False


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "http://no-such-host.invalid:8000", "not a url", ""])
def test_unreachable_engines_are_error_values(url: str) -> None:
    assert engine_http.health(url, 1) is False
    m = engine_http.scrape(url, 1)
    assert not m.ok and m.error


@pytest.mark.parametrize("reply", [b"hello, not HTTP\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\nshort", b""])
def test_a_peer_that_does_not_speak_http_is_an_error_value(reply: bytes) -> None:
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(4096)
            conn.sendall(reply)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        m = engine_http.scrape(f"http://127.0.0.1:{port}", 2)
        assert not m.ok and m.error
        # /health reads the status line only: a 200 with a short body is healthy
        assert engine_http.health(f"http://127.0.0.1:{port}", 2) is reply.startswith(b"HTTP/1.1 200")
    finally:
        listener.close()
        thread.join(5)


# -- a hostile or broken engine cannot hold kvwatch ------------------------------------------------

import socket as _socket  # noqa: E402
import threading as _threading  # noqa: E402
import time as _time  # noqa: E402


def _drip_server(payload: bytes, every: float) -> tuple[str, _threading.Event]:
    """A peer that answers any request with `payload`, one byte every `every` seconds."""
    srv = _socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = _threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue

            def drip(c: _socket.socket = conn) -> None:
                with c:
                    try:
                        c.recv(4096)
                        for byte in payload:
                            if stop.is_set():
                                return
                            c.sendall(bytes([byte]))
                            _time.sleep(every)
                    except OSError:
                        return
            _threading.Thread(target=drip, daemon=True).start()
        srv.close()

    _threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", stop


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_dripping_engine_is_cut_at_the_deadline(where: str) -> None:
    page = b"vllm:num_requests_running 1\n" * 50
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(page)
    url, stop = _drip_server(head + page, 0.3 if where == "headers" else 0.05)   # both far longer than 1 s
    try:
        # cut, not read to the end (which would be a whole page and 200); the time: bench/bench_deadlines.py
        m = engine_http.scrape(url, timeout=1.0)
        assert not m.ok and ("TimeoutError" in (m.error or "") or "timed out" in (m.error or "")), m.error
        assert engine_http.health(url, timeout=1.0) is False
    finally:
        stop.set()


def test_a_redirect_is_not_followed() -> None:
    url, stop = _drip_server(b"HTTP/1.1 302 Found\r\nLocation: http://203.0.113.9/metrics\r\nContent-Length: 0\r\n\r\n", 0)
    try:
        m = engine_http.scrape(url, timeout=2.0)
        assert not m.ok and "HTTP 302" in (m.error or "")
        assert engine_http.health(url, timeout=2.0) is False
    finally:
        stop.set()


def test_an_endless_body_is_cut_at_the_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvwatch.boundary.engine_http as eh
    monkeypatch.setattr(eh, "MAX_PAGE_BYTES", 1000)   # the limit, not the function under test
    body = b"x" * 5000
    url, stop = _drip_server(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + body, 0)
    try:
        m = eh.scrape(url, timeout=5.0)
        assert not m.ok and "larger than 1000 bytes" in (m.error or "")
    finally:
        stop.set()


def test_the_watch_loop_is_not_held_by_a_dripping_engine() -> None:
    """`kvwatch export`'s tick on an engine whose /health and /metrics drip: it ends within its
    deadlines and says the engine is down, instead of keeping the last good values."""
    from kvwatch.engine_status import EngineState, EngineStatus
    from kvwatch.exporter.watch import EngineTarget, Watch
    url, stop = _drip_server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", 0.3)
    try:
        target = EngineTarget(EngineStatus("x", EngineState.READY), url=url, external=True)
        watch = Watch(lambda: [target], interval=1.0)          # timeout min(3, interval) = 1 s per exchange
        snap = watch.tick()   # how long it takes: bench/bench_deadlines.py
        assert snap.engines[0].up is False
    finally:
        stop.set()


def test_the_engine_load_is_summed_over_its_ranks() -> None:
    from kvwatch.boundary.engine_http import EngineLoad, parse_metrics
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0\n'
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0\n'
        'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9\n'
        'vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 99.0\n'
        "# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 30.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 12.0\n'
    )
    assert parse_metrics(page).load == EngineLoad(running=3, waiting=4, prompt_tokens=100, generation_tokens=42)
    assert parse_metrics('vllm:kv_cache_usage_perc{engine="0"} 0.5\n').load == EngineLoad()


def test_finished_request_lengths_are_read_from_the_histograms() -> None:
    from kvwatch.boundary.engine_http import parse_metrics
    page = "".join(
        f'vllm:request_{h}_tokens_bucket{{engine="{e}",le="{le}"}} {n}\n'
        for h, rows in (("prompt", ((10.0, 1), (100.0, 3), ("+Inf", 3))), ("generation", ((10.0, 2), (100.0, 3), ("+Inf", 3))))
        for e in ("0", "1") for le, n in rows) + (
        'vllm:request_prompt_tokens_sum{engine="0"} 150\nvllm:request_prompt_tokens_count{engine="0"} 3\n'
        'vllm:request_prompt_tokens_sum{engine="1"} 150\nvllm:request_prompt_tokens_count{engine="1"} 3\n'
        'vllm:request_generation_tokens_sum{engine="0"} 40\nvllm:request_generation_tokens_sum{engine="1"} 40\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n')
    load = parse_metrics(page).load
    assert (load.request_tokens, load.requests) == (380, 6)
    assert load.prompt_buckets == ((10.0, 2.0), (100.0, 6.0)) and load.generation_buckets == ((10.0, 4.0), (100.0, 6.0))


# -- a hostile page: many series, long labels (issue 30) ---------------------------------------------

def _cache_line(engine: str, **extra: str) -> str:
    labels = {"block_size": "128", "cache_dtype": "auto", "engine": engine, "num_gpu_blocks": "16384",
              "gpu_memory_utilization": "0.92", "kv_cache_memory_bytes": str(1 << 30),
              "kv_cache_size_tokens": "2097152", **extra}
    return "vllm:cache_config_info{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "} 1.0"


def hostile_page(series: int, label_bytes: int) -> str:
    """`series` ranks of the families kvwatch reads, each with labels of `label_bytes`."""
    pad = "x" * label_bytes
    lines = ["# TYPE vllm:kv_cache_usage_perc gauge"]
    for i in range(series // 2):
        rank = f"{i}{pad}" if label_bytes else str(i)
        lines.append(_cache_line(rank, model_name=pad))
        lines.append(f'vllm:kv_cache_usage_perc{{engine="{rank}",model_name="{pad}"}} 0.5')
    return "\n".join(lines) + "\n"


def _kvwatch_page(metrics: EngineMetrics) -> str:
    from exporter_support import fixture_context, render

    from kvwatch.engine_status import EngineState, EngineStatus
    from kvwatch.exporter.actual import actual_per_rank, plan_for_reported
    from kvwatch.exporter.snapshot import EngineSnapshot, WatchSnapshot

    ctx = fixture_context("cpu_default")
    ranks = actual_per_rank(ctx, metrics.ranks)
    planned = plan_for_reported(ctx, metrics.cache) if metrics.cache is not None else None
    status = EngineStatus(name="e", state=EngineState.READY, plan=planned)
    engine = EngineSnapshot(status, up=True, metrics=metrics, planned=planned, actual=ranks.get("0"),
                            actual_ranks=ranks or None)
    return render(WatchSnapshot(taken_at=1.0, engines=(engine,)))


@pytest.mark.parametrize("series, label_bytes", [(100_000, 0), (600, 10_000), (2_000, 2_000), (2_000, 60)])
def test_many_series_or_long_labels_keep_kvwatchs_own_page_small(series: int, label_bytes: int) -> None:
    page = hostile_page(series, label_bytes)
    metrics = parse_metrics(page)
    assert metrics.ok, metrics.error
    assert len(metrics.ranks) <= engine_http.MAX_RANKS
    assert all(len(r.rank) <= engine_http.MAX_LABEL_CHARS for r in metrics.ranks)
    own = _kvwatch_page(metrics)
    assert len(own.encode()) < 1 << 20, len(own)       # kvwatch's own /metrics stays under 1 MB
    assert "x" * 100 not in own                         # no long label value of the engine's in it


def test_a_long_cache_dtype_never_becomes_a_label() -> None:
    m = parse_metrics(_cache_line("0", cache_dtype="fp8" + "y" * 5000) + "\n")
    assert m.ok and m.cache is not None and m.cache.cache_dtype is None and m.cache.num_gpu_blocks == 16384


def test_a_page_of_other_series_is_checked_by_its_head_only() -> None:
    # a million series kvwatch does not read: no parse of them all (the 12 s ticks of issue 30)
    page = "".join(f'other_series{{i="{i}"}} 1\n' for i in range(200_000)) + "garbage{{{\n"
    m = parse_metrics(page)
    assert not m.ok and m.error == "no vllm: metrics on the page"
