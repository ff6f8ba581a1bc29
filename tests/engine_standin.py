"""A stand-in for the engine's HTTP side: fixed routes served on loopback, which a test may
change while it runs (an engine turning unhealthy, a slow or broken /metrics)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Route = tuple[int, bytes, float]  # status, body, seconds to wait before answering


class _Engine(BaseHTTPRequestHandler):
    routes: dict[str, Route] = {}

    def do_GET(self) -> None:  # noqa: N802
        status, body, delay = self.routes.get(self.path, (404, b"", 0.0))
        time.sleep(delay)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_routes(routes: dict[str, Route]) -> Iterator[str]:
    """Serve `routes` (the dict itself: later changes show) and yield the base URL."""
    handler = type("Engine", (_Engine,), {"routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
