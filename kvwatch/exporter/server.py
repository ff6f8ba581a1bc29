"""HTTP(S) serving of /metrics, /-/healthy (liveness) and /-/ready (readiness), with optional TLS
and basic auth (web config).

A ThreadingHTTPServer: one thread per connection, so a slow client never holds up
another scrape; the TLS handshake happens in that thread too, never in the accept loop.
bcrypt checks are cached, failed ones too (bcrypt is slow by design, a scrape is not).

Bounded before anything is buffered: a request head is at most MAX_HEAD_BYTES in at most
MAX_HEADER_LINES lines (431 otherwise); a request body (none is expected) is read and dropped
up to MAX_BODY_BYTES, else the connection is closed after the answer, and so is one that says
`Transfer-Encoding` (a body of unknown length), so a body is never read as the next request.
An answer goes out in one write (headers and body together, TCP_NODELAY): on a kept-alive
connection, as Prometheus scrapes, a second small write would wait on Nagle and the client's
delayed ACK (~40 ms a scrape).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import http.client
import logging
import math
import re
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import bcrypt
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from kvwatch.errors import KvwatchError
from kvwatch.exporter.eviction import to_evict
from kvwatch.exporter.fair_turns import FairTurns
from kvwatch.exporter.family_memo import Encoder, FamilyMemo
from kvwatch.exporter.web_config import WebConfig
from kvwatch.listen import DEFAULT_LISTEN, parse_listen

_LOG = logging.getLogger(__name__)

REQUEST_TIMEOUT = 30.0  # seconds one read or write may wait
CONNECTION_DEADLINE = 15.0  # seconds a whole connection may take (handshake, request, response)
MAX_CONNECTIONS = 256       # connections served at once (threads and memory bounded); see _Server.process_request
MAX_HEAD_BYTES = 16 * 1024  # a request line and its headers (Prometheus sends ~300 bytes)
MAX_HEADER_LINES = 64
MAX_BODY_BYTES = 64 * 1024  # a body (none is expected) read and dropped; a longer one closes the connection
_INDEX = (b"<html><head><title>kvwatch</title></head><body><h1>kvwatch</h1>"
          b'<p><a href="/metrics">Metrics</a></p></body></html>\n')


class BasicAuth:
    """Checks user:password against bcrypt hashes; remembers successes, and failures for a while.

    bcrypt is slow by design, so a flood of wrong passwords would take the CPU: as Prometheus'
    exporter-toolkit does, one bcrypt check runs at a time and the others queue for it (at most
    QUEUE_WAIT seconds: a credential not yet known waits its turn, it is not refused because
    another check runs), and every result is remembered, failures too, so a credential tried
    again costs no bcrypt. A known-good credential never waits: its success is remembered.
    Beyond the toolkit, the queue is fair by client address and bcrypt's share of a core is
    bounded (fair_turns.py): a brute force from one address takes at most BCRYPT_SHARE of a core
    and delays another address's new credential by one check per address waiting."""

    MAX_CACHED = 1024
    FAILED_FOR = 60.0   # seconds a failed credential is refused without a new bcrypt check
    QUEUE_WAIT = 10.0   # seconds a check may wait for the one before it (below the connection deadline)
    BCRYPT_SHARE = 0.25  # of one core, at most, however many new credentials arrive

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = dict(users)
        self._ok: set[bytes] = set()
        self._failed: dict[bytes, float] = {}
        self._lock = threading.Lock()
        self._bcrypt = FairTurns(self.BCRYPT_SHARE)
        self._dummy: bytes | None = None  # compared against for unknown users: same time as a known one

    def __bool__(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None, client: str = "",
              cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Whether `header` carries a known user's password; `client` (the peer's address) is whose
        turn a bcrypt check takes; `cancelled` ends its wait for the turn (its connection was cut)."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join([user.encode(), password.encode(), hashed or b""])).digest()
        known = self._known(key, hashed is not None)
        if known is not None:
            return known
        if not self._bcrypt.acquire(client, self.QUEUE_WAIT, cancelled):
            return False      # the queue is that long (a flood of new credentials), or the connection was cut
        try:
            known = self._known(key, hashed is not None)   # checked while this one queued
            if known is not None:
                return known
            ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else self._dummy_hash())
        except ValueError:  # a malformed hash in the config
            _LOG.warning("basic auth: the hash of user %r is not a valid bcrypt hash", user)
            return False
        finally:
            self._bcrypt.release()
        ok = ok and hashed is not None
        with self._lock:
            cache = self._ok if ok else self._failed
            if len(cache) >= self.MAX_CACHED:
                cache.clear()
            if ok:
                self._ok.add(key)
            else:
                self._failed[key] = time.monotonic() + self.FAILED_FOR
        return ok

    def _known(self, key: bytes, user_known: bool) -> bool | None:
        """The remembered result for `key`: True, False, or None when it must be checked."""
        with self._lock:
            if user_known and key in self._ok:
                return True
            if self._failed.get(key, 0.0) > time.monotonic():
                return False
        return None

    def _dummy_hash(self) -> bytes:
        if self._dummy is None:
            self._dummy = bcrypt.hashpw(b"kvwatch", bcrypt.gensalt(rounds=10))
        return self._dummy


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    server_address: tuple[str, int] | tuple[str, int, int, int]   # getsockname() of an AF_INET(6) socket
    request_queue_size = 256   # the listen backlog: under a burst of connections (socketserver's 5
    #                            would drop SYNs, and a dropped SYN costs a client a whole second)

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 tls: ssl.SSLContext | None) -> None:
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.tls = tls
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: dict[int, tuple[float, socket.socket]] = {}   # id -> (deadline, socket)
        # Both tables are keyed by the connection's own thread: under TLS the handler sees the
        # wrapped socket, not the one accepted, so a socket's id would not match across them.
        self._waiting: dict[int, float] = {}   # thread -> since when the connection waits for a request head
        self._peers: dict[int, tuple[str, float]] = {}   # thread -> (client address, accepted when)
        self._cut_keys: set[int] = set()                  # threads whose connection was cut
        self._per_peer: Counter[str] = Counter()          # client address -> connections it holds
        self._open_lock = threading.Lock()
        # The reaper sleeps until the earliest deadline of a connection it has not cut yet, and while
        # no connection is open until one is: a connection that opens with an earlier deadline than
        # the one it sleeps for wakes it (it used to look every 0.25 s, open connections or not: 4
        # wake-ups a second, 7 % of `kvwatch export`'s CPU in bench/bench_overhead.py).
        self._deadlines = threading.Condition(self._open_lock)
        self._reaper_wakes_at = math.inf                   # when the reaper looks next
        self._reaped: dict[int, socket.socket] = {}        # thread -> the socket the reaper cut
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()
        super().__init__(address, handler)

    def waiting(self, yes: bool) -> None:
        """Called from the connection's thread: it waits for a request head (or no longer)."""
        with self._open_lock:
            if yes:
                self._waiting[threading.get_ident()] = time.monotonic()
            else:
                self._waiting.pop(threading.get_ident(), None)

    def _evict_one(self) -> bool:
        now = time.monotonic()
        with self._open_lock:
            key = to_evict(self._waiting, self._peers, self._per_peer, now, MAX_CONNECTIONS)
            if key is None:
                return False
            self._waiting.pop(key, None)
            self._cut_keys.add(key)
            sock = self._open[key][1]
        _cut(sock)
        return True

    def was_cut(self) -> bool:
        """Called from the connection's thread: its connection was cut (a wait may end now)."""
        return threading.get_ident() in self._cut_keys

    def server_close(self) -> None:
        self._closed.set()
        with self._open_lock:
            self._deadlines.notify_all()
        super().server_close()

    def _watch_deadlines(self) -> None:
        """One thread for every connection's deadline (not a timer thread per connection); it
        ends with the server."""
        while True:
            with self._open_lock:
                while True:
                    if self._closed.is_set():
                        return
                    now = time.monotonic()
                    pending = [(deadline, key, sock) for key, (deadline, sock) in self._open.items()
                               if self._reaped.get(key) is not sock]   # each socket is cut once
                    late = [(key, sock) for deadline, key, sock in pending if deadline <= now]
                    if late:
                        break
                    self._reaper_wakes_at = min((deadline for deadline, _, _ in pending), default=math.inf)
                    self._deadlines.wait(None if self._reaper_wakes_at == math.inf else self._reaper_wakes_at - now)
                self._reaper_wakes_at = -math.inf   # cutting: nothing to wake it for
                self._cut_keys.update(key for key, _ in late)
                self._reaped.update(late)
            for _, sock in late:
                _cut(sock)

    def process_request(self, request: Any, client_address: Any) -> None:
        # One thread per connection, but never more than MAX_CONNECTIONS. When all are taken, one
        # gives way (eviction.py: an idle or slow one of the address holding the most): a scraper's
        # request takes milliseconds, so it gets in, and a flood costs no more than MAX_CONNECTIONS threads.
        if not self._slots.acquire(blocking=False):
            if not (self._evict_one() and self._slots.acquire(timeout=0.2)):
                self.shutdown_request(request)   # at once: the accept queue must not wait on it
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def _track(self, sock: socket.socket, deadline: float) -> None:
        """The socket the deadline and the eviction cut for this connection's thread: the accepted
        one, then (under TLS) the wrapper, which detaches the accepted one from its descriptor."""
        with self._open_lock:
            self._open[threading.get_ident()] = (deadline, sock)
            if deadline < self._reaper_wakes_at:
                self._deadlines.notify()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # The whole connection has one deadline: a client that sends its request a byte at a time
        # (slowloris) or reads the answer as slowly is cut off, whatever each read's timeout.
        self._track(request, time.monotonic() + CONNECTION_DEADLINE)
        with self._open_lock:
            self._peers[threading.get_ident()] = (str(client_address[0]), time.monotonic())
            self._per_peer[str(client_address[0])] += 1
        with self._open_lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._watch_deadlines, name="kvwatch-http-deadlines",
                                                daemon=True)
                self._reaper.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(threading.get_ident(), None)
                self._reaped.pop(threading.get_ident(), None)
                self._waiting.pop(threading.get_ident(), None)
                peer = self._peers.pop(threading.get_ident(), None)
                if peer is not None:
                    self._per_peer[peer[0]] -= 1
                    if self._per_peer[peer[0]] <= 0:
                        del self._per_peer[peer[0]]
                self._cut_keys.discard(threading.get_ident())
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or times out is routine: one debug line, no traceback on stderr.
        _LOG.debug("connection from %s ended with an error", client_address, exc_info=True)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Runs in the connection's own thread: the handshake cannot stall the accept loop.
        request.settimeout(REQUEST_TIMEOUT)
        try:
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        with self._open_lock:
            deadline = self._open[threading.get_ident()][0]
        try:
            # The handshake waits for the client like a request head does: the deadline and the
            # eviction must reach it, so the wrapper is tracked before the handshake starts.
            conn = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except (ssl.SSLError, OSError) as exc:
            _LOG.debug("TLS with %s failed: %s", client_address, exc)
            return
        self._track(conn, deadline)
        try:
            self.waiting(True)
            try:
                conn.do_handshake()
            finally:
                self.waiting(False)
        except (ssl.SSLError, OSError) as exc:
            _LOG.debug("TLS handshake with %s failed: %s", client_address, exc)
            conn.close()
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            try:
                conn.close()
            except OSError:
                pass


_OPENMETRICS_VERSION = re.compile(r"(application/openmetrics-text[^,]*?;\s*version=)([^;,\s]*)")
MAX_ACCEPT_CHARS = 1024


def bounded_accept(accept: str | None) -> str | None:
    """The Accept header with OpenMetrics versions rounded to the ones there are (1.0.0, 2.0.0; anything
    else to 0.0.1, which prometheus_client declines): prometheus_client echoes the version it is asked
    for into the content type, and the render cache is keyed by it, so each new version string would
    be one more rendering kept and refreshed every tick."""
    if not accept:
        return accept

    def canonical(m: re.Match[str]) -> str:
        major = m.group(2).split(".", 1)[0]
        version = "2.0.0" if major.isdigit() and int(major) >= 2 else "1.0.0" if major == "1" else "0.0.1"
        return m.group(1) + version

    return _OPENMETRICS_VERSION.sub(canonical, accept[:MAX_ACCEPT_CHARS])


class _HeadLimit:
    """The connection's reader, with a budget for the request head: readline() never returns
    more than MAX_HEAD_BYTES in all or more than MAX_HEADER_LINES lines (http.client's own limits,
    64 KiB a line and 100 lines, let 256 connections buffer 1.6 GB before any credential).
    BaseHTTPRequestHandler answers a head over budget with 431 (http.client.LineTooLong)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.reset()

    def reset(self) -> None:
        self._left = MAX_HEAD_BYTES
        self._lines = MAX_HEADER_LINES + 1   # the request line, then the headers

    def readline(self, limit: int = -1) -> bytes:
        if self._left <= 0 or self._lines <= 0:
            raise http.client.LineTooLong("request head over its limit")
        want = self._left + 1 if limit < 0 else min(limit, self._left + 1)
        line: bytes = self._raw.readline(want)
        self._left -= len(line)
        self._lines -= 1
        if self._left < 0:
            raise http.client.LineTooLong("request head over its limit")
        return line

    def __getattr__(self, name: str) -> Any:      # read(), close(), ... of the connection's file
        return getattr(self._raw, name)


def _cut(sock: socket.socket) -> None:
    """Shut the connection down under the thread serving it, whose read or write then fails at once.
    socket.socket's own shutdown, also for a TLS wrapper: SSLSocket.shutdown would first drop the
    TLS state that the serving thread is using."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class RenderCache:
    """The exposition of one snapshot, rendered once per format, off the scrape path: the
    watch loop calls refresh() after each swap and scrapes are a lookup. Only the first
    scrape in a format (or one racing a swap) renders. `version()` returns the current
    snapshot object (immutable, replaced each tick)."""

    def __init__(self, registry: CollectorRegistry, version: Callable[[], object] | None = None) -> None:
        self._registry = registry
        self._version = version
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[Encoder, object, bytes]] = {}
        self._families = FamilyMemo()   # unchanged families keep their text between renders

    def render(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(bounded_accept(accept) or "")
        if self._version is None:
            return encoder(self._registry), content_type
        current = self._version()
        with self._lock:
            hit = self._cached.get(content_type)
            if hit is not None and hit[1] is current:
                return hit[2], content_type
        return self._render(encoder, content_type, current), content_type

    def refresh(self) -> None:
        """Render the current snapshot in every format scrapers have asked for."""
        if self._version is None:
            return
        current = self._version()
        with self._lock:
            stale = [(encoder, content_type) for content_type, (encoder, version, _) in self._cached.items()
                     if version is not current]
        for encoder, content_type in stale:
            self._render(encoder, content_type, current)

    def _render(self, encoder: Encoder, content_type: str, current: object) -> bytes:
        output = self._families.render(encoder, self._registry)  # may be newer than `current`: only fresher
        with self._lock:
            self._cached[content_type] = (encoder, current, output)
        return output


class MetricsServer:
    """Serves a registry at /metrics (and /-/healthy) on ``listen``; start() returns at once."""

    def __init__(self, registry: CollectorRegistry, listen: str = DEFAULT_LISTEN,
                 web_config: WebConfig | None = None, version: Callable[[], object] | None = None,
                 readiness: Callable[[], tuple[bool, str]] | None = None) -> None:
        web_config = web_config or WebConfig()
        tls = web_config.tls.context() if web_config.tls is not None else None
        auth = BasicAuth(web_config.users)
        try:
            self._renders = RenderCache(registry, version)
            self._server = _Server(parse_listen(listen), _handler(self._renders, auth, readiness), tls)
        except OSError as exc:
            raise KvwatchError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        self._thread: threading.Thread | None = None
        self.scheme = "https" if tls is not None else "http"

    def prerender(self) -> None:
        """Render the new snapshot now (the watch loop calls this), so no scrape waits for it."""
        self._renders.refresh()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="kvwatch-http", daemon=True)
        self._thread.start()
        _LOG.info("serving metrics on %s/metrics", self.url)

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _handler(renderer: RenderCache, auth: BasicAuth,
             readiness: Callable[[], tuple[bool, str]] | None = None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server: _Server
        server_version = "kvwatch"
        protocol_version = "HTTP/1.1"

        def version_string(self) -> str:
            return self.server_version   # the Server header names no runtime (no Python version)

        def setup(self) -> None:
            super().setup()
            self.rfile = _HeadLimit(self.rfile)  # type: ignore[assignment]

        def handle_one_request(self) -> None:
            self.server.waiting(True)          # until a request head has arrived
            self.rfile.reset()  # type: ignore[attr-defined]
            try:
                super().handle_one_request()
            except http.client.LineTooLong:    # the request line itself over the budget
                self.close_connection = True
                self.requestline, self.request_version, self.command = "", "HTTP/1.1", None  # type: ignore[assignment]
                self.send_error(431, "Request head too large")

        def parse_request(self) -> bool:
            ok = super().parse_request()
            self.server.waiting(False)
            if ok:
                ok = self._skip_body()
            return ok

        def _skip_body(self) -> bool:
            """Read and drop a request's body (none is expected) so that it is never taken for the
            next request; a body of unknown or large size closes the connection after the answer."""
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = True   # chunked or not, CL+TE: never guess where it ends
                return True
            length = self.headers.get_all("Content-Length") or []
            if not length:
                return True
            if len(set(length)) != 1 or not length[0].strip().isdigit():
                self.close_connection = True
                self.send_error(400, "Bad Content-Length")
                return False
            size = int(length[0])
            if size > MAX_BODY_BYTES:
                self.close_connection = True
                return True
            while size > 0:
                chunk = self.rfile.read(min(size, 16 * 1024))
                if not chunk:
                    self.close_connection = True
                    break
                size -= len(chunk)
            return True

        def do_GET(self) -> None:  # noqa: N802
            self._serve(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._serve(body=False)

        def _authorized(self) -> bool:
            if not auth:
                return True
            # A check waiting for its bcrypt turn counts as waiting: a flood of them gives way
            # (eviction.py) and, once cut, stops waiting.
            self.server.waiting(True)
            try:
                return auth.check(self.headers.get("Authorization"), self.client_address[0], self.server.was_cut)
            finally:
                self.server.waiting(False)

        def _not_allowed(self) -> None:
            # Other methods: the credentials are checked first, as for GET, then 405.
            if not self._authorized():
                self._reply(401, b"Unauthorized\n", "text/plain; charset=utf-8", True,
                            {"WWW-Authenticate": 'Basic realm="kvwatch"'})
                return
            self.close_connection = True
            self._reply(405, b"Method Not Allowed\n", "text/plain; charset=utf-8", True, {"Allow": "GET, HEAD"})

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed  # noqa: N815

        def _serve(self, body: bool) -> None:
            if not self._authorized():
                self._reply(401, b"Unauthorized\n", "text/plain; charset=utf-8", body,
                            {"WWW-Authenticate": 'Basic realm="kvwatch"'})
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    output, content_type = renderer.render(self.headers.get("Accept"))
                except Exception:
                    _LOG.exception("rendering /metrics failed")
                    self._reply(500, b"error rendering metrics\n", "text/plain; charset=utf-8", body)
                    return
                self._reply(200, output, content_type, body)
            elif path == "/-/healthy":
                self._reply(200, b"OK\n", "text/plain; charset=utf-8", body)
            elif path == "/-/ready":
                # 200 only while the engine serves: a Service routes traffic to this pod only then,
                # and not while kvwatch corrects a failed plan. The body names the state.
                ready, state = readiness() if readiness is not None else (True, "ready")
                self._reply(200 if ready else 503, f"{state}\n".encode(), "text/plain; charset=utf-8", body)
            elif path == "/":
                self._reply(200, _INDEX, "text/html; charset=utf-8", body)
            else:
                self._reply(404, b"Not Found\n", "text/plain; charset=utf-8", body)

        def _reply(self, status: int, payload: bytes, content_type: str, body: bool,
                   headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            if self.close_connection:
                self.send_header("Connection", "close")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            # One write for the head and the body (see the module's docstring).
            buffered: list[bytes] = getattr(self, "_headers_buffer")  # noqa: B009 (send_header's, private)
            head = b"".join(buffered) + b"\r\n"
            buffered.clear()
            self.wfile.write(head + payload if body else head)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            _LOG.debug("%s %s", self.address_string(), format % args)

    return Handler

