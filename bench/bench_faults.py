"""kvwatch's HTTP server under the attacks of issue 30, beside a well-behaved scraper.

The exporter is `kvwatch export` watching a stand-in engine that serves a /metrics page captured
from the real CPU engine, first plain, then with TLS and basic auth. The scraper scrapes /metrics
every 0.1 s as Prometheus does: on one kept-alive connection (a connection the server closed
meanwhile is retried once on a new one, as Go's HTTP client does; only a scrape that still gets
no 200 counts as failed), and, in the baseline, on a fresh connection each time. Each attacker
runs in a process of its own (the scraper's timing is not the attacker's GIL), each phase for
--seconds, loopback only, each bounded in connections:
- idle-2000:      2,000 connections opened and left idle;
- new-conns:      8 threads opening a connection, sending nothing, closing it, as fast as they can;
- slowloris:      200 connections sending a request head a byte every 0.5 s;
- big-headers:    waves of 256 connections each sending ~6 MB of header lines, a wave every 2 s;
- smuggle:        GETs with a Content-Length body that holds a second request (and CL+TE pairs);
- silent-tcp:     (TLS) 300 TCP connections that never send a ClientHello;
- tls-drip:       (TLS) 260 connections that finish the handshake, then send a byte every 20 s;
- bad-passwords:  (auth) 8 threads sending new wrong passwords as fast as they can.
For each phase: the scraper's scrapes, failures, p50 and p99 (ms), kvwatch's peak RSS and threads.
Bar (issue 30): no failed scrape, p99 < 50 ms, kept-alive as fast as fresh, RSS < 100 MB.

Then two hostile engines, each for --seconds: the stand-in engine's page holds 100,000 series, or
labels of 10 KB (kvwatch export's peak RSS, the size of its own /metrics, its engine collector's
duration against the 5 s tick); and kvwatch's stdout stalled (a pipe nobody reads) for
--stall-seconds, then read, while an engine logs 2 MB/s through the OutputPump (the engine's
longest write, the lines dropped and counted).

Run: .venv/bin/python bench/bench_faults.py [--seconds 10]
"""
from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import multiprocessing
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import bcrypt
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_overhead import Engine  # noqa: E402
from engine_support import free_port  # noqa: E402

METRICS = ROOT / "tests" / "fixtures" / "metrics"
BAR_P99_S = 0.050
BAR_RSS = 100 * 2**20
KVWATCH_ROOT = ROOT      # --kvwatch-root: the kvwatch package run (an earlier commit's, for a before/after)
GOOD = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()
ATTACKER = "127.0.0.2"   # the brute force's address (loopback: all of 127/8 is local)
NEW_USERS = [f"newcomer{i}" for i in range(3)]   # credentials first used during the brute force


# -- the well-behaved scraper ---------------------------------------------------------------------

class Scraper:
    """GET /metrics every `period` seconds, kept alive (or fresh), as Prometheus does."""

    def __init__(self, port: int, tls: ssl.SSLContext | None, auth: bool, keep_alive: bool) -> None:
        self.port, self.tls, self.auth, self.keep_alive = port, tls, auth, keep_alive
        self.conn: http.client.HTTPConnection | None = None
        self.times: list[float] = []
        self.failures = 0

    def _connect(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.tls)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def _once(self, conn: http.client.HTTPConnection) -> int:
        headers = {"Accept": "text/plain", "Authorization": GOOD} if self.auth else {"Accept": "text/plain"}
        if not self.keep_alive:
            headers["Connection"] = "close"
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status

    def scrape(self) -> None:
        t0 = time.perf_counter()
        status = 0
        reused = self.conn is not None
        try:
            if self.conn is None:
                self.conn = self._connect()
            status = self._once(self.conn)
        except (OSError, http.client.HTTPException):
            self._drop()
            if reused:     # the server closed a kept-alive connection: retried on a new one (Go's client)
                try:
                    self.conn = self._connect()
                    status = self._once(self.conn)
                except (OSError, http.client.HTTPException):
                    self._drop()
        if not self.keep_alive:
            self._drop()
        if status == 200:
            self.times.append(time.perf_counter() - t0)
        else:
            self.failures += 1

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def run(self, stop: threading.Event, period: float = 0.1) -> None:
        while not stop.is_set():
            self.scrape()
            stop.wait(period)
        self._drop()


# -- the attackers (each in a process of its own) ---------------------------------------------------

def _connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return None


def idle(port: int, stop: threading.Event, count: int = 2000) -> None:
    socks = [s for s in (_connect(port) for _ in range(count)) if s is not None]
    stop.wait()
    for s in socks:
        s.close()


def new_conns(port: int, stop: threading.Event) -> None:
    def run() -> None:
        while not stop.is_set():
            s = _connect(port)
            if s is not None:
                s.close()
    _threads(run, 8, stop)


def slowloris(port: int, stop: threading.Event) -> None:
    _drippers(port, stop, 200, 0.5, b"GET /metrics HTTP/1.1\r\nHost: x\r\n", None)


def silent_tcp(port: int, stop: threading.Event) -> None:
    idle(port, stop, 300)


def tls_drip(port: int, stop: threading.Event) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _drippers(port, stop, 260, 20.0, b"", ctx)


def _drippers(port: int, stop: threading.Event, count: int, every: float, first: bytes,
              tls: ssl.SSLContext | None) -> None:
    def open_one() -> socket.socket | None:
        s = _connect(port)
        if s is None:
            return None
        try:
            if tls is not None:
                s = tls.wrap_socket(s)
            if first:
                s.sendall(first)
            return s
        except OSError:
            s.close()
            return None
    socks = [s for s in (open_one() for _ in range(count)) if s is not None]
    while not stop.wait(every):
        for s in list(socks):
            try:
                s.sendall(b"X")
            except OSError:    # cut by the server: reconnect, as an attacker does
                socks.remove(s)
                s.close()
                n = open_one()
                if n is not None:
                    socks.append(n)
    for s in socks:
        s.close()


def big_headers(port: int, stop: threading.Event) -> None:
    """Waves of 256 connections, each sending ~6 MB of header lines (a wave every 2 s)."""
    line = b"X-Big: " + b"v" * 60_000 + b"\r\n"

    def one() -> None:
        while not stop.is_set():
            s = _connect(port)
            if s is not None:
                try:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    for _ in range(100):          # ~6 MB of header lines
                        s.sendall(line)
                except OSError:
                    pass
                finally:
                    s.close()
            stop.wait(2.0)
    _threads(one, 256, stop)


def smuggle(port: int, stop: threading.Event) -> None:
    inner = b"GET /nothere HTTP/1.1\r\nHost: x\r\n\r\n"
    heads = [b"Content-Length: %d\r\n" % len(inner),
             b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(inner)]

    def run() -> None:
        n = 0
        while not stop.is_set():
            s = _connect(port)
            if s is None:
                continue
            try:
                s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n" + heads[n % 2] + b"\r\n" + inner)
                s.settimeout(1)
                s.recv(65536)
            except OSError:
                pass
            finally:
                s.close()
            n += 1
    _threads(run, 4, stop)


def bad_passwords(port: int, stop: threading.Event, tls: bool) -> None:
    counter = iter(range(10**9))
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    def run() -> None:
        while not stop.is_set():
            auth = "Basic " + base64.b64encode(f"prometheus:wrong{next(counter)}".encode()).decode()
            # From another address, as a brute force comes from another host (the fair queue is by address).
            conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=15, context=ctx,
                                                source_address=(ATTACKER, 0)) if tls
                    else http.client.HTTPConnection("127.0.0.1", port, timeout=15, source_address=(ATTACKER, 0)))
            try:
                conn.request("GET", "/metrics", headers={"Authorization": auth})
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
    _threads(run, 32, stop)


def _threads(fn: Callable[[], None], n: int, stop: threading.Event) -> None:
    threads = [threading.Thread(target=fn, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    stop.wait()


# -- kvwatch export, plain or TLS + basic auth --------------------------------------------------------

def self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    crt, pem = tmp / "tls.crt", tmp / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def start_kvwatch(tmp: Path, engine_port: int, secure: bool) -> tuple[subprocess.Popen, int, ssl.SSLContext | None]:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    shutil.copy(METRICS / "cpu_block64.config.json", model / "config.json")
    args = []
    client = None
    if secure:
        crt, key = self_signed(tmp)
        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
        users = "".join(f"  {u}: '{hashed}'\n" for u in ["prometheus", *NEW_USERS])
        (tmp / "web.yml").write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
                                     f"basic_auth_users:\n{users}")
        args = ["--web-config", str(tmp / "web.yml")]
        client = ssl.create_default_context(cafile=str(crt))
        client.check_hostname = False
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", f"http://127.0.0.1:{engine_port}",
         "--name", "bench", "--model", str(model), "--device", "cpu", "--no-nvml", *args,
         "--state-dir", str(tmp / "state"), "--listen", f"127.0.0.1:{port}"],
        cwd=KVWATCH_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = Scraper(port, client, secure, keep_alive=False)
    deadline = time.monotonic() + 60
    while not probe.times:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("kvwatch export did not come up")
        probe.scrape()
        time.sleep(0.3)
    return proc, port, client


def phase(name: str, attack: Callable[[threading.Event], None] | None, seconds: float, me: psutil.Process,
          scraper: Scraper) -> tuple[str, int, int, float, float, float, int, float]:
    mp = multiprocessing.get_context("fork")
    stop, attacker_stop, attacker = threading.Event(), mp.Event(), None
    if attack is not None:
        attacker = mp.Process(target=attack, args=(attacker_stop,), daemon=True)
        attacker.start()
        time.sleep(1.0)
    scraper.times, scraper.failures = [], 0
    runner = threading.Thread(target=scraper.run, args=(stop,), daemon=True)
    runner.start()
    rss = threads = 0
    t0, cpu0 = time.monotonic(), sum(me.cpu_times()[:2])
    while time.monotonic() - t0 < seconds:
        try:
            rss, threads = max(rss, me.memory_info().rss), max(threads, me.num_threads())
        except psutil.Error:
            break
        time.sleep(0.2)
    cpu = (sum(me.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
    stop.set()
    runner.join(20)
    attacker_stop.set()
    if attacker is not None:
        attacker.join(10)
        if attacker.is_alive():
            attacker.kill()
            attacker.join()
    times = sorted(scraper.times)
    p50 = times[len(times) // 2] if times else float("inf")
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else float("inf")
    return name, len(times), scraper.failures, p50, p99, rss / 2**20, threads, cpu * 100


def newcomers(port: int, client: ssl.SSLContext, seconds: float) -> list[float]:
    """During a brute force from ATTACKER: seconds until each never-seen credential's first 200."""
    mp = multiprocessing.get_context("fork")
    stop = mp.Event()
    attacker = mp.Process(target=bad_passwords, args=(port, stop, True), daemon=True)
    attacker.start()
    time.sleep(min(2.0, seconds / 2))
    waits = []
    try:
        for user in NEW_USERS:
            header = "Basic " + base64.b64encode(f"{user}:s3cret".encode()).decode()
            t0 = time.perf_counter()
            status = 0
            while status != 200 and time.perf_counter() - t0 < 30:
                conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=client)
                try:
                    conn.request("GET", "/metrics", headers={"Authorization": header})
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except (OSError, http.client.HTTPException):
                    pass
                finally:
                    conn.close()
            waits.append(time.perf_counter() - t0 if status == 200 else float("inf"))
    finally:
        stop.set()
        attacker.join(10)
        if attacker.is_alive():
            attacker.kill()
    return waits


def hostile_page(series: int, label_bytes: int) -> bytes:
    pad = "x" * label_bytes
    lines = [(METRICS / "cpu_block64.txt").read_text().rstrip("\n")]
    for i in range(series // 2):
        rank = f"{i}{pad}" if label_bytes else str(i)
        lines.append(f'vllm:cache_config_info{{block_size="64",cache_dtype="auto",engine="{rank}",'
                     f'num_gpu_blocks="21845",model_name="{pad}"}} 1.0')
        lines.append(f'vllm:kv_cache_usage_perc{{engine="{rank}",model_name="{pad}"}} 0.5')
    return ("\n".join(lines) + "\n").encode()


def hostile_engines(seconds: float) -> None:
    print(f"{'engine page':<28}{'page MB':>8}{'RSS MB':>8}{'own /metrics KB':>16}{'engine tick s':>14}", flush=True)
    for name, page in (("100,000 series", hostile_page(100_000, 0)), ("10 KB labels x 600", hostile_page(600, 10_000)),
                       ("2 KB labels x 4,000", hostile_page(4000, 2000))):
        class Hostile(Engine):
            pass
        Hostile.page = page
        engine = __import__("http.server").server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
        threading.Thread(target=engine.serve_forever, daemon=True).start()
        tmp = Path(tempfile.mkdtemp(prefix="bench-faults-"))
        try:
            proc, port, _ = start_kvwatch(tmp, engine.server_address[1], False)
            me = psutil.Process(proc.pid)
            rss, own, tick = 0, 0, 0.0
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                rss = max(rss, me.memory_info().rss)
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/metrics")
                body = conn.getresponse().read()
                conn.close()
                own = max(own, len(body))
                for line in body.decode().splitlines():
                    if line.startswith('kvwatch_collector_duration_seconds{collector="engine"}'):
                        tick = max(tick, float(line.split()[-1]))
                time.sleep(0.5)
            proc.terminate()
            proc.wait(10)
        finally:
            engine.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"{name:<28}{len(page) / 2**20:8.1f}{rss / 2**20:8.1f}{own / 1024:16.1f}{tick:14.3f}", flush=True)


_LOGGER = r"""
import os, sys, time
seconds = float(sys.argv[1])
block = (b"x" * 199 + b"\n") * 100      # 20 kB, 100 times a second: 2 MB/s
longest, written = 0.0, 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    start = time.monotonic()
    os.write(1, block)
    longest = max(longest, time.monotonic() - start)
    written += 100
    time.sleep(max(0.0, 0.01 - (time.monotonic() - start)))
os.write(2, f"{longest * 1000:.2f} {written}\n".encode())
"""


def stalled_stdout(seconds: float) -> None:
    """The OutputPump of KVWATCH_ROOT's package (one without a LogSink: the pipe itself), kvwatch's
    stdout a pipe nobody reads for `seconds`, then read, while an engine logs 2 MB/s."""
    sys.path.insert(0, str(KVWATCH_ROOT))
    for name in [n for n in sys.modules if n == "kvwatch" or n.startswith("kvwatch.")]:
        del sys.modules[name]
    from kvwatch.watchdog import output_pump

    out_read, out_write = os.pipe()        # kvwatch's stdout: nobody reads it for `seconds`
    stdout = os.fdopen(out_write, "wb")
    sink_class = getattr(output_pump, "LogSink", None)
    sink = sink_class(stdout) if sink_class is not None else stdout
    proc = subprocess.Popen([sys.executable, "-c", _LOGGER, str(seconds + 5)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    pump = output_pump.OutputPump("bench", proc.stdout.fileno(), sink).start()
    time.sleep(seconds)

    def reader() -> None:                  # the reader wakes up
        while os.read(out_read, 1 << 20):
            pass
    threading.Thread(target=reader, daemon=True).start()
    proc.wait(seconds + 60)
    longest_ms, written = proc.stderr.read().split()
    pump.join(10)
    dropped = getattr(sink, "lines_dropped", 0)
    print(f"stdout stalled {seconds:.0f} s (then read), engine logging 2 MB/s for {seconds + 5:.0f} s: engine's longest "
          f"write {float(longest_ms):.2f} ms (bar < 100 ms); {int(written):,} lines written of "
          f"{int((seconds + 5) * 10_000):,} at 2 MB/s, {pump.lines_seen:,} seen by the pump, {dropped:,} dropped and "
          f"counted", flush=True)
    proc.stdout.close()
    proc.stderr.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--stall-seconds", type=float, default=30.0)
    ap.add_argument("--kvwatch-root", default=str(ROOT), help="run the kvwatch package in this directory")
    ap.add_argument("--only", choices=("http", "engine", "stdout"), help="one section only")
    ap.add_argument("--attack", help="with --only http: the baseline and this attack only")
    args = ap.parse_args()
    global KVWATCH_ROOT
    KVWATCH_ROOT = Path(args.kvwatch_root)
    print(f"kvwatch from {KVWATCH_ROOT}", flush=True)
    if args.only in (None, "http"):
        http_attacks(args.seconds, args.attack)
    if args.only in (None, "engine"):
        hostile_engines(args.seconds)
    if args.only in (None, "stdout"):
        stalled_stdout(args.stall_seconds)


def http_attacks(seconds: float, only: str | None = None) -> None:
    engine = __import__("http.server").server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    print(f"{'server':<12}{'phase':<15}{'scraper':<11}{'ok':>5}{'failed':>7}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'RSS MB':>8}{'threads':>8}{'CPU %':>7}", flush=True)
    rows = []
    for secure in (False, True):
        tmp = Path(tempfile.mkdtemp(prefix="bench-faults-"))
        proc, port, client = start_kvwatch(tmp, engine.server_address[1], secure)
        me = psutil.Process(proc.pid)
        label = "TLS+auth" if secure else "plain"
        attacks: list[tuple[str, Callable[[threading.Event], None] | None]] = [
            ("baseline", None),
            ("idle-2000", partial(idle, port)),
            ("new-conns", partial(new_conns, port)),
            ("slowloris", partial(slowloris, port)),
            ("big-headers", partial(big_headers, port)),
        ]
        if secure:
            attacks += [("silent-tcp", partial(silent_tcp, port)), ("tls-drip", partial(tls_drip, port)),
                        ("bad-passwords", partial(bad_passwords, port, tls=True))]
        else:
            attacks += [("smuggle", partial(smuggle, port))]
        attacks = [(n, a) for n, a in attacks if only is None or n in ("baseline", only)]
        try:
            for name, attack in attacks:
                kinds = [("fresh", False), ("keep-alive", True)] if attack is None else [("keep-alive", True)]
                for kind, keep in kinds:
                    row = phase(name, attack, seconds, me, Scraper(port, client, secure, keep))
                    rows.append((label, kind, *row))
                    _, ok, failed, p50, p99, rss, threads, cpu = row
                    print(f"{label:<12}{name:<15}{kind:<11}{ok:5d}{failed:7d}{p50 * 1000:8.2f}{p99 * 1000:8.2f}"
                          f"{rss:8.1f}{threads:8d}{cpu:7.1f}", flush=True)
                    time.sleep(1.0)
            if client is not None and only in (None, "bad-passwords"):
                waits = newcomers(port, client, seconds)
                print(f"{label:<12}{'bad-passwords':<15}new credentials from another address, first 200 after: "
                      + ", ".join(f"{w * 1000:.0f} ms" for w in waits), flush=True)
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(tmp, ignore_errors=True)
    engine.shutdown()
    failed = sum(r[4] for r in rows)
    worst_p99 = max(r[6] for r in rows)
    worst_rss = max(r[7] for r in rows)
    fresh = {r[0]: r[5] for r in rows if r[1] == "fresh"}
    kept = {r[0]: r[5] for r in rows if r[1] == "keep-alive" and r[2] == "baseline"}
    ratio = max((kept[k] / fresh[k] for k in kept), default=0.0)
    held = failed == 0 and worst_p99 < BAR_P99_S and worst_rss * 2**20 < BAR_RSS and ratio <= 1.5
    print("(CPU %: kvwatch's own; the attacker runs on the same CPUs)")
    print(f"bar: no failed scrape ({failed} failed), p99 < 50 ms (worst {worst_p99 * 1000:.1f} ms), "
          f"keep-alive p50 / fresh p50 <= 1.5 ({ratio:.2f}), RSS < 100 MB (worst {worst_rss:.1f} MB): "
          f"{'PASS' if held else 'MISS'}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
