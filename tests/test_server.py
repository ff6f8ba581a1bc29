"""Serving /metrics: plain HTTP, TLS (a self-signed CA and certificates made here), client
certificates and bcrypt basic auth from an exporter-toolkit web config file."""
from __future__ import annotations

import base64
import datetime
import http.client
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from prometheus_client import CollectorRegistry
from waiting import eventually

from kvwatch.errors import ConfigError, KvwatchError
from kvwatch.exporter.collector import KvwatchCollector
from kvwatch.exporter.server import BasicAuth, MetricsServer
from kvwatch.exporter.snapshot import WatchSnapshot
from kvwatch.exporter.web_config import load_web_config

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

# A fixed salt: the hash appears in parametrize ids, which must be the same in every pytest-xdist worker.
PASSWORD_HASH = bcrypt.hashpw(b"s3cret", b"$2b$04$" + b"kvwatchTestSaltKvwatcO").decode()


def _cert(tmp: Path, name: str, issuer: tuple | None = None, ca: bool = False, client: bool = False):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer[0].subject if issuer else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]),
            critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert, key, cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("pki")
    ca_cert, ca_key, ca_path, _ = _cert(tmp, "ca", ca=True)
    _, _, server_crt, server_key = _cert(tmp, "server", issuer=(ca_cert, ca_key))
    _, _, client_crt, client_key = _cert(tmp, "client", issuer=(ca_cert, ca_key), client=True)
    return {"ca": ca_path, "server_crt": server_crt, "server_key": server_key,
            "client_crt": client_crt, "client_key": client_key}


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(KvwatchCollector(WatchSnapshot.empty))
    return registry


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    servers: list[MetricsServer] = []

    def start(web_config: str | None = None) -> MetricsServer:
        config = None
        if web_config is not None:
            path = tmp_path / "web.yml"
            path.write_text(web_config)
            config = load_web_config(path)
        server = MetricsServer(_registry(), "127.0.0.1:0", config)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def get(url: str, auth: tuple[str, str] | None = None, context: ssl.SSLContext | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def client_context(pki: dict[str, Path], with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if with_cert:
        ctx.load_cert_chain(pki["client_crt"], pki["client_key"])
    return ctx


def test_plain_http_paths(serve) -> None:
    server = serve()
    status, headers, body = get(server.url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert b'kvwatch_build_info{version="' in body
    assert get(server.url + "/-/healthy")[:1] == (200,)
    assert get(server.url + "/")[0] == 200
    assert get(server.url + "/nope")[0] == 404
    status, _, body = get(server.url + "/metrics", method="HEAD")
    assert status == 200 and body == b""


def test_basic_auth(serve) -> None:
    server = serve(f"basic_auth_users:\n  prometheus: '{PASSWORD_HASH}'\n")
    status, headers, _ = get(server.url + "/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert get(server.url + "/metrics", auth=("prometheus", "wrong"))[0] == 401
    assert get(server.url + "/metrics", auth=("nobody", "s3cret"))[0] == 401
    assert get(server.url + "/-/healthy")[0] == 401  # every path is protected
    status, _, body = get(server.url + "/metrics", auth=("prometheus", "s3cret"))
    assert status == 200 and b"kvwatch_build_info" in body


def test_tls(serve, pki: dict[str, Path]) -> None:
    server = serve(f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n")
    assert server.url.startswith("https://")
    status, _, body = get(server.url + "/metrics", context=client_context(pki))
    assert status == 200 and b"kvwatch_build_info" in body
    with pytest.raises(urllib.error.URLError):  # an untrusting client refuses the self-signed chain
        get(server.url + "/metrics", context=ssl.create_default_context())
    plain = server.url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get(plain + "/metrics")
    # the server survives bad handshakes
    assert get(server.url + "/-/healthy", context=client_context(pki))[0] == 200


def test_tls_connections_leave_no_waiting_entry_behind(serve, pki: dict[str, Path]) -> None:
    """The slot table and the waiting table are keyed alike under TLS too (the handler sees the wrapped
    socket): 20 finished scrapes leave nothing waiting, so eviction can find idle connections."""
    server = serve(f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n")
    import http.client
    for _ in range(10):   # kept-alive connections: the handler waits for a next request head, then the client leaves
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(pki), timeout=5)
        for _ in range(2):
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and b"kvwatch_build_info" in response.read()
        conn.close()
    assert eventually(lambda: not server._server._waiting and not server._server._open, timeout=10)


def test_tls_and_basic_auth_together(serve, pki: dict[str, Path]) -> None:
    server = serve(f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n"
                   f"basic_auth_users:\n  prometheus: '{PASSWORD_HASH}'\n")
    ctx = client_context(pki)
    assert get(server.url + "/metrics", context=ctx)[0] == 401
    assert get(server.url + "/metrics", auth=("prometheus", "nope"), context=ctx)[0] == 401
    assert get(server.url + "/metrics", auth=("prometheus", "s3cret"), context=ctx)[0] == 200


def test_client_certificates(serve, pki: dict[str, Path]) -> None:
    server = serve(f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n"
                   f"  client_ca_file: {pki['ca']}\n  client_auth_type: RequireAndVerifyClientCert\n"
                   f"  min_version: TLS13\n")
    assert get(server.url + "/metrics", context=client_context(pki, with_cert=True))[0] == 200
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(server.url + "/metrics", context=client_context(pki))


def test_relative_paths_are_relative_to_the_web_config(tmp_path: Path, pki: dict[str, Path]) -> None:
    (tmp_path / "tls").mkdir()
    for key in ("server_crt", "server_key"):
        (tmp_path / "tls" / pki[key].name).write_bytes(pki[key].read_bytes())
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: tls/server.crt\n  key_file: tls/server.key\n")
    config = load_web_config(path)
    assert config.tls is not None and config.tls.cert_file == tmp_path / "tls" / "server.crt"
    config.tls.context()  # loads


def test_successful_checks_are_cached() -> None:
    slow = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=12))  # ~0.2 s per check
    auth = BasicAuth({"u": slow})
    header = "Basic " + base64.b64encode(b"u:pw").decode()
    start = time.perf_counter()
    assert auth.check(header)
    first = time.perf_counter() - start
    start = time.perf_counter()
    assert all(auth.check(header) for _ in range(50))
    assert time.perf_counter() - start < first  # 50 cached checks cost less than one bcrypt
    assert not auth.check("Basic " + base64.b64encode(b"u:wrong").decode())
    assert not auth.check("Basic !!!") and not auth.check("Bearer x") and not auth.check(None)


@pytest.mark.parametrize("text,message", [
    ("tls_server_config: {cert_file: a.crt}\n", "key_file is required"),
    ("tls_server_config: {cert_file: a, key_file: b, cipher_suites: [x]}\n", "not supported by kvwatch: cipher_suites"),
    ("http_server_config: {http2: true}\n", "not supported by kvwatch: http_server_config"),
    ("basic_auth_users: {u: plaintext}\n", "expected a bcrypt hash"),
    ("basic_auth_users: [u]\n", "must map user names"),
    ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: Sometimes}\n", "client_auth_type"),
    ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAndVerifyClientCert}\n",
     "needs client_ca_file"),
    ("tls_server_config: {cert_file: a, key_file: b, min_version: SSL3}\n", "min_version"),
    ("tls_server_config: [\n", "not YAML"),
    ("- a\n", "expected a mapping"),
    # once read as its first MiB: the comment, and the TLS section after it silently dropped
    ("#" + "x" * (1 << 20) + "\ntls_server_config: {cert_file: a.crt, key_file: a.key}\n", "larger than 1 MiB"),
    # bounded: cost 31 is hours of a core per check (at start, then per request), a user list, the depth
    (f"basic_auth_users: {{u: '{PASSWORD_HASH.replace('$04$', '$31$')}'}}\n", "bcrypt cost 31 above 14"),
    ("basic_auth_users: {u: '$2b$04$short'}\n", "not a valid bcrypt hash"),
    ("basic_auth_users:\n" + "".join(f"  u{i}: '{PASSWORD_HASH}'\n" for i in range(1001)), "more than 1000 users"),
    ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
])
def test_bad_web_configs_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_web_config(path)
    assert "\n" not in str(info.value)


def test_unusable_certificate_files_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config: {cert_file: missing.crt, key_file: missing.key}\n")
    with pytest.raises(ConfigError, match="TLS certificate or key"):
        MetricsServer(_registry(), "127.0.0.1:0", load_web_config(path))
    with pytest.raises(ConfigError, match="cannot read"):
        load_web_config(tmp_path / "absent.yml")


def test_a_busy_port_is_one_clear_error(serve) -> None:
    server = serve()
    with pytest.raises(KvwatchError, match="cannot listen on"):
        MetricsServer(_registry(), f"127.0.0.1:{server.port}")


def test_a_stalled_client_does_not_block_other_scrapes(serve, pki: dict[str, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that never sends its TLS hello holds its own thread, not the accept loop: the
    scrape is answered (within get's 5 s), though no stalled connection ends for an hour. How fast:
    bench/bench_deadlines.py."""
    import socket

    from kvwatch.exporter import server as server_module
    monkeypatch.setattr(server_module, "CONNECTION_DEADLINE", 3600.0)
    server = serve(f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n")
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        assert get(server.url + "/metrics", context=client_context(pki))[0] == 200
    finally:
        for s in stalled:
            s.close()


def test_render_cache_renders_once_per_snapshot() -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

    from kvwatch.exporter.server import RenderCache

    class Counting:
        renders = 0
        snapshot: object = object()

        def collect(self):
            Counting.renders += 1
            yield GaugeMetricFamily("kvwatch_test", "test", value=Counting.renders)

    registry = CollectorRegistry()
    registry.register(Counting())
    Counting.renders = 0
    cache = RenderCache(registry, version=lambda: Counting.snapshot)
    first, _ = cache.render(None)
    assert cache.render(None)[0] is first and Counting.renders == 1   # same snapshot: no render
    Counting.snapshot = object()                                      # the watch loop swapped it
    second, _ = cache.render(None)
    assert Counting.renders == 2 and b"kvwatch_test 2.0" in second
    assert cache.render("application/openmetrics-text")[1].startswith("application/openmetrics-text")
    # The watch loop swaps the snapshot and refreshes: both formats asked for are rendered then,
    # and the scrapes that follow render nothing.
    Counting.snapshot = object()
    cache.refresh()
    assert Counting.renders == 5
    pages = cache.render(None)[0] + cache.render("application/openmetrics-text")[0]
    assert b"kvwatch_test 4" in pages and b"kvwatch_test 5" in pages
    assert Counting.renders == 5
    cache.refresh()  # nothing new: nothing rendered
    assert Counting.renders == 5


def test_the_exporter_renders_in_the_watch_loop_not_on_the_scrape() -> None:
    from prometheus_client.core import GaugeMetricFamily

    from kvwatch.exporter.service import Exporter
    from kvwatch.exporter.targets import SupervisedEngines

    class Renders:  # counts the renders of the exporter's own registry
        count = 0

        def collect(self):
            Renders.count += 1
            yield GaugeMetricFamily("kvwatch_test_renders", "test", value=Renders.count)

    with Exporter(SupervisedEngines(lambda: []), listen="127.0.0.1:0", interval=2.0) as exporter:
        exporter.registry.register(Renders())  # (the registry describes it once: a render)
        url = exporter.url + "/metrics"
        before = Renders.count
        urllib.request.urlopen(url, timeout=5).read()  # the first scrape in this format renders it
        assert Renders.count == before + 1
        eventually(lambda: Renders.count != before + 1, 10, 0.02)  # the next tick renders
        assert Renders.count == before + 2
        page = urllib.request.urlopen(url, timeout=5).read()  # well inside the 2 s interval: a lookup
        assert Renders.count == before + 2 and b"kvwatch_test_renders %d.0" % (before + 2) in page


def test_the_render_cache_is_bounded_whatever_the_accept_headers() -> None:
    """2,000 distinct OpenMetrics versions (a flood from anyone who may scrape) make at most one
    rendering per real exposition format, not one per header."""
    from kvwatch.exporter.server import RenderCache, bounded_accept
    snapshot = object()
    cache = RenderCache(_registry(), version=lambda: snapshot)
    types = set()
    for n in range(2000):
        _, content_type = cache.render(f"application/openmetrics-text; version=1.0.{n}")
        types.add(content_type)
    for accept in ("application/openmetrics-text; version=2.7.1", "application/openmetrics-text; version=x",
                   "text/plain; version=0.0.4", None, "application/openmetrics-text; version=1.0.0; escaping=dots"):
        _, content_type = cache.render(accept)
        types.add(content_type)
    assert len(cache._cached) == len(types) <= 5, types
    assert bounded_accept("application/openmetrics-text; version=1.0.77") == "application/openmetrics-text; version=1.0.0"
    assert bounded_accept("x" * 5000) == "x" * 1024


# -- hostile clients (issue 15, item 6) ---------------------------------------------------------------

def test_other_methods_check_credentials_first_and_the_server_names_no_runtime(serve) -> None:
    server = serve(f"basic_auth_users:\n  prometheus: '{PASSWORD_HASH}'\n")
    for method in ("OPTIONS", "TRACE", "POST", "DELETE"):
        assert get(server.url + "/metrics", method=method)[0] == 401
        status, headers, _ = get(server.url + "/metrics", auth=("prometheus", "s3cret"), method=method)
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, _ = get(server.url + "/metrics", auth=("prometheus", "s3cret"))
    assert status == 200 and headers["Server"] == "kvwatch" and "Python" not in str(headers)


def test_idle_connections_are_bounded_and_scrapes_still_answer(serve) -> None:
    import socket as socketlib

    from kvwatch.exporter import server as server_module
    server = serve()
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(server_module.MAX_CONNECTIONS * 3):
            s = socketlib.create_connection(("127.0.0.1", server.port), timeout=5)
            idle.append(s)
        time.sleep(0.5)
        assert threading.active_count() - threads_before <= server_module.MAX_CONNECTIONS + 2
    finally:
        for s in idle:
            s.close()
    # slots free again once the idle ones are gone
    assert eventually(lambda: get(server.url + "/-/healthy")[0] == 200, server_module.CONNECTION_DEADLINE + 5, 0.2)


def test_a_slowloris_client_is_cut_at_the_connection_deadline(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket as socketlib

    from kvwatch.exporter import server as server_module
    monkeypatch.setattr(server_module, "CONNECTION_DEADLINE", 1.5)
    server = serve()
    s = socketlib.create_connection(("127.0.0.1", server.port), timeout=10)
    t0 = time.monotonic()
    try:
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        closed = False
        for byte in request:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
            if time.monotonic() - t0 > 5:
                break
        if not closed:
            closed = s.recv(100) == b""
        assert closed   # before the request was all sent (5 s); how soon: bench/bench_deadlines.py
    finally:
        s.close()


def test_the_deadline_reaper_sleeps_while_no_connection_is_open(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """It wakes for the earliest deadline of an open connection, not every quarter second: an idle
    exporter costs no wake-ups (bench/bench_overhead.py), and a connection opened later is still cut."""
    import math
    import socket as socketlib

    from kvwatch.exporter import server as server_module
    monkeypatch.setattr(server_module, "CONNECTION_DEADLINE", 0.5)
    server = serve()
    inner = server._server
    assert get(server.url + "/metrics")[0] == 200
    # the scrape's deadline passes: nothing is open, so the reaper waits for no time at all
    assert eventually(lambda: inner._reaper_wakes_at == math.inf, 5, 0.05)
    s = socketlib.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")   # and then nothing: cut at its deadline
        t0 = time.monotonic()
        assert s.recv(100) == b""
        assert time.monotonic() - t0 < 3
    finally:
        s.close()
    assert eventually(lambda: inner._reaper_wakes_at == math.inf, 5, 0.05)


def test_a_client_reset_prints_no_traceback(serve, capsys: pytest.CaptureFixture[str]) -> None:
    import socket as socketlib
    import struct
    server = serve()
    for _ in range(20):
        s = socketlib.create_connection(("127.0.0.1", server.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setsockopt(socketlib.SOL_SOCKET, socketlib.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        s.close()
    time.sleep(0.5)
    assert get(server.url + "/-/healthy")[0] == 200
    assert "Traceback" not in capsys.readouterr().err


def _closed_within(sock, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (recv sees EOF or a reset)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(100) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_tls_connections_are_cut_at_the_deadline_in_the_handshake_and_after_it(
        serve, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # The deadline and the eviction used to shut down the raw socket, which the TLS wrapper had
    # already detached: the error was swallowed and the connection stayed open.
    import socket as socketlib

    from kvwatch.exporter import server as server_module
    monkeypatch.setattr(server_module, "CONNECTION_DEADLINE", 1.0)
    server = serve(f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n")
    silent = socketlib.create_connection(("127.0.0.1", server.port), timeout=10)   # never sends a ClientHello
    raw = socketlib.create_connection(("127.0.0.1", server.port), timeout=10)
    shaken = client_context(pki).wrap_socket(raw, server_hostname="localhost")      # handshakes, then stays silent
    try:
        assert _closed_within(silent, 4.0)
        assert _closed_within(shaken, 4.0)
    finally:
        silent.close()
        shaken.close()
    assert get(server.url + "/-/healthy", context=client_context(pki))[0] == 200


def test_idle_tls_connections_give_way_to_a_scrape(serve, pki: dict[str, Path]) -> None:
    import socket as socketlib

    from kvwatch.exporter import server as server_module
    server = serve(f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n")
    idle = []
    try:
        for _ in range(server_module.MAX_CONNECTIONS + 20):   # every slot taken by a silent TLS client
            idle.append(socketlib.create_connection(("127.0.0.1", server.port), timeout=10))
        time.sleep(1.0)
        answered = sum(get(server.url + "/-/healthy", context=client_context(pki))[0] == 200 for _ in range(5))
        assert answered == 5
    finally:
        for s in idle:
            s.close()


# -- issue 30: keep-alive in one write, bodies never read as requests, a bounded head --------------

def _responses(sock: socket.socket, quiet: float = 0.5) -> bytes:
    """Everything the server sends until it closes or stays quiet for `quiet` seconds."""
    sock.settimeout(quiet)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def test_a_kept_alive_answer_comes_in_one_write(serve) -> None:
    # headers and body in two writes: the second waits on Nagle and the client's delayed ACK
    # (~40 ms a scrape on a kept-alive connection); in one write the first read holds it all
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        for _ in range(5):
            s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            first = s.recv(65536)
            assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\nOK\n"), first


@pytest.mark.parametrize("head, closes", [
    (b"Content-Length: 25\r\n", False),                                  # consumed: keep-alive goes on
    (b"Content-Length: 25\r\nTransfer-Encoding: chunked\r\n", True),     # CL+TE: never guessed
    (b"Transfer-Encoding: chunked\r\n", True),
    (b"Content-Length: 999999999\r\n", True),                            # too long to read: closed
])
def test_a_request_body_is_never_answered_as_a_request(serve, head: bytes, closes: bool) -> None:
    server = serve()
    smuggled = b"GET /nothere HTTP/1.1\r\n\r\n"    # 25 bytes: a second request if read as one
    assert len(smuggled) == 25
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + smuggled)
        out = _responses(s)
        assert out.count(b"HTTP/1.1 ") == 1 and b"404" not in out, out
        assert (b"Connection: close" in out) == closes
        if not closes:     # the connection is still good for the next scrape
            s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _responses(s).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("head", [
    # within http.client's own limits (100 lines of 64 KiB): 3.6 MB a connection, before any credential
    b"GET /-/healthy HTTP/1.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 60_000) for i in range(60)),
    b"GET /-/healthy HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(80)),
    b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n",
])
def test_a_request_head_is_bounded_before_it_is_buffered(serve, head: bytes) -> None:
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        sender = threading.Thread(target=lambda: _send_quietly(s, head + b"\r\n"), daemon=True)
        sender.start()
        out = _responses(s, quiet=2)
        assert out.startswith(b"HTTP/1.1 431"), out[:200]
        sender.join(5)


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:     # the server closed it at its bound: what is tested
        pass


def test_a_new_credential_queues_behind_a_running_check() -> None:
    slow = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=12))
    auth = BasicAuth({"u": slow, "v": bcrypt.hashpw(b"pw2", bcrypt.gensalt(rounds=4))})
    wrong = "Basic " + base64.b64encode(b"u:wrong").decode()
    busy = threading.Thread(target=auth.check, args=(wrong,))
    busy.start()                       # a brute-force check runs...
    time.sleep(0.02)
    assert auth.check("Basic " + base64.b64encode(b"v:pw2").decode())   # ...a real credential waits its turn
    busy.join()


def test_a_kept_alive_scraper_outlives_a_flood_of_idle_connections_from_elsewhere(
        serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot taken by idle connections from another address (127.0.0.2): the scraper's own
    kept-alive connection, idle longest of all, is not the one cut; the flood's are."""
    from kvwatch.exporter import server as server_module
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 16)
    server = serve()
    scraper = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    scraper.request("GET", "/-/healthy")
    assert scraper.getresponse().read()
    time.sleep(0.6)                                      # idle past the grace, before any of the flood
    flood = []
    try:
        for _ in range(16 * 3):
            flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=5,
                                                  source_address=("127.0.0.2", 0)))
            time.sleep(0.02)
        time.sleep(0.6)
        scraper.request("GET", "/-/healthy")             # the same connection, never reopened
        assert scraper.getresponse().status == 200
    finally:
        scraper.close()
        for s in flood:
            s.close()


def test_a_brute_force_takes_its_share_of_bcrypt_and_a_new_credential_gets_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """6 threads of wrong passwords from one address: bcrypt runs at most BasicAuth.BCRYPT_SHARE
    of the time (plus the check running at the end), and a real credential from another address,
    not yet known, is checked and let in while the flood goes on."""
    import kvwatch.exporter.server as server_module
    spent: list[float] = []
    real = bcrypt.checkpw

    def timed(password: bytes, hashed: bytes) -> bool:
        t0 = time.perf_counter()
        try:
            return real(password, hashed)
        finally:
            spent.append(time.perf_counter() - t0)

    monkeypatch.setattr(server_module.bcrypt, "checkpw", timed)
    auth = BasicAuth({"u": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=8))})
    stop = threading.Event()
    counter = iter(range(10**9))

    def brute() -> None:
        while not stop.is_set():
            auth.check("Basic " + base64.b64encode(f"u:guess{next(counter)}".encode()).decode(), "127.0.0.2")

    flood = [threading.Thread(target=brute) for _ in range(6)]
    t0 = time.perf_counter()
    for t in flood:
        t.start()
    time.sleep(0.5)
    assert auth.check("Basic " + base64.b64encode(b"u:pw").decode(), "127.0.0.1")
    time.sleep(1.5)
    stop.set()
    for t in flood:
        t.join(15)
    elapsed = time.perf_counter() - t0        # the queued checks finish after the stop: counted in
    assert len(spent) >= 3
    assert sum(spent[:-1]) <= BasicAuth.BCRYPT_SHARE * elapsed + max(spent)
