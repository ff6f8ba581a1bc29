"""A stand-in for vLLM's API server in the fast supervisor tests (a real child process, no model).

    python tests/fake_engine.py --model DIR --port P [--block-size N] [behaviour flags]

It takes vLLM's flags, so kvwatch plans and rewrites its command like a real one, and
behaves as the real CPU engine did where the tests need it:
- a --block-size that is not a multiple of 32: prints the real log of that failure
  (tests/fixtures/logs/cpu_block_size_8.log) and exits 1, as vLLM 0.32 does on the CPU;
- --fail-log FILE: prints FILE and exits 1;
- --fail-once MARKER: the first run (MARKER absent) creates MARKER and fails that way;
- otherwise serves /health and /metrics (vllm:cache_config_info with the block size it
  was given) after --ready-after seconds, with one child process in its group (like
  EngineCore); --die-after S: exits 1 with the real engine-died log after S seconds of
  serving (once per --die-once MARKER); --never-ready: never listens;
- --startup-log FILE: prints FILE (a real engine's start-up lines) in place of its own KV cache line;
- --flood MB: writes MB megabytes of lines as fast as it can, then exits 0;
- --drip S: every answer is sent one byte each S seconds (a hung or hostile engine's HTTP);
- --count-file FILE: each /metrics request appends one byte to FILE (how often the engine is read);
- --escape FILE: a descendant double-forks into a session of its own (setsid), ignores SIGTERM,
  and writes its pid to FILE;
- --daemon FILE: a descendant double-forks (no setsid: it keeps the engine's session), ignores
  SIGTERM and writes its pid to FILE.
  Both start with an empty environment and retitle themselves as vLLM does (argv[0] and
  /proc/self/comm: VLLM::Daemon): nothing of kvwatch's marker is left to read in them.
"""
from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"


def emit(path: Path) -> None:
    sys.stdout.buffer.write(path.read_bytes())
    sys.stdout.flush()


class Handler(http.server.BaseHTTPRequestHandler):
    block_size = 128
    drip: float | None = None
    blocks_file: Path | None = None   # "BLOCK_SIZE NUM_GPU_BLOCKS", read on each scrape: a test changes it
    load_file: Path | None = None     # "RUNNING PROMPT_TOKENS GENERATION_TOKENS", read on each scrape
    count_file: Path | None = None    # one byte appended per /metrics request

    def cache(self) -> tuple[int, int]:
        if self.blocks_file is not None:
            size, blocks = self.blocks_file.read_text().split()
            return int(size), int(blocks)
        return self.block_size, 8192

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/health":
            body = b""
        elif self.path == "/metrics":
            if self.count_file is not None:
                with open(self.count_file, "ab") as count:
                    count.write(b".")
            block_size, blocks = self.cache()
            body = ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                    "# TYPE vllm:cache_config_info gauge\n"
                    f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",'
                    f'engine="0",num_gpu_blocks="{blocks}"}} 1.0\n')
            if self.load_file is not None:
                running, prompt, generated, *more = self.load_file.read_text().split()
                body += (f'vllm:num_requests_running{{engine="0"}} {running}\n'
                         f'vllm:prompt_tokens_total{{engine="0"}} {prompt}\n'
                         f'vllm:generation_tokens_total{{engine="0"}} {generated}\n')
                if more:   # PREEMPTIONS WAITING
                    body += (f'vllm:num_preemptions_total{{engine="0"}} {more[0]}\n'
                             f'vllm:num_requests_waiting{{engine="0"}} {more[1]}\n')
            body = body.encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        if self.drip is not None:
            reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            for byte in reply:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(self.drip)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


# os._exit, not sys.exit: the parents vanish at once, so kvwatch's view of the tree never catches the
# daemon while it is still a descendant (the test proves it the engine's by its session, not its tree).
DAEMON = """import os, signal, sys, time
if os.fork(): os._exit(0)
if {setsid}: os.setsid()
else: os.setpgid(0, 0)   # out of the engine's group (a killpg misses it), still in its session
if os.fork(): os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open("/proc/self/comm", "w") as f: f.write("VLLM::Daemon")
tmp = {pid_file!r} + ".tmp"
with open(tmp, "w") as f: f.write(str(os.getpid()))
os.replace(tmp, {pid_file!r})
while True: time.sleep(1)
"""


def daemonize(pid_file: str, setsid: bool) -> None:
    """A double-forked daemon: an empty environment, a vLLM-like title, SIGTERM ignored."""
    code = DAEMON.format(setsid=setsid, pid_file=pid_file)
    subprocess.Popen(["VLLM::Daemon", "-c", code], executable=sys.executable, env={}).wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--block-size", type=int)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-model-len")
    p.add_argument("--fail-log")
    p.add_argument("--fail-once")
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--die-after", type=float)
    p.add_argument("--die-once")
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--flood", type=float)
    p.add_argument("--env-dump")
    p.add_argument("--drip", type=float)
    p.add_argument("--escape")
    p.add_argument("--daemon")
    p.add_argument("--load-file", help="the load /metrics reports: 'RUNNING PROMPT_TOKENS GENERATION_TOKENS "
                                       "[PREEMPTIONS WAITING]', read per scrape")
    p.add_argument("--count-file", help="each /metrics request appends one byte to this file")
    p.add_argument("--gate", help="a file whose existence lets the engine go on past --ready-after")
    p.add_argument("--startup-log", help="a real start-up log to replay before serving (e.g. a GPU run's)")
    p.add_argument("--blocks-file", help="the cache /metrics reports: 'BLOCK_SIZE NUM_GPU_BLOCKS', read per scrape")
    args, _ = p.parse_known_args()
    print(f"(APIServer pid={os.getpid()}) INFO fake engine starting: {' '.join(sys.argv[1:])}", flush=True)
    if args.env_dump:
        Path(args.env_dump).write_text("\n".join(f"{k}={v}" for k, v in sorted(os.environ.items())))
    if args.flood:
        line = b"(Worker pid=1) INFO " + b"x" * 100 + b"\n"
        total = int(args.flood * 2**20)
        chunk = line * 1000
        for _ in range(-(-total // len(chunk))):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.write(b"flood done\n")
        sys.stdout.flush()
        return 0
    if args.fail_once and not Path(args.fail_once).exists():
        Path(args.fail_once).touch()
        emit(Path(args.fail_log) if args.fail_log else LOGS / "cpu_block_size_8.log")
        return 1
    if args.fail_log and not args.fail_once:
        emit(Path(args.fail_log))
        return 1
    if args.block_size is not None and args.block_size % 32:
        emit(LOGS / "cpu_block_size_8.log")
        return 1
    for pid_file, setsid in ((args.escape, True), (args.daemon, False)):
        if pid_file:
            daemonize(pid_file, setsid)
    # EngineCore stand-in: same process group, outlives nothing on its own.
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    print(f"(EngineCore pid={child.pid}) INFO started", flush=True)
    if args.never_ready:
        while True:
            time.sleep(1)
    time.sleep(args.ready_after)
    while args.gate and not Path(args.gate).exists():   # the test says when the engine may go on
        time.sleep(0.1)
    if args.startup_log:
        emit(Path(args.startup_log))
    Handler.block_size = args.block_size or 128
    Handler.drip = args.drip
    Handler.blocks_file = Path(args.blocks_file) if args.blocks_file else None
    Handler.load_file = Path(args.load_file) if args.load_file else None
    Handler.count_file = Path(args.count_file) if args.count_file else None
    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.startup_log:
        emit(Path(args.startup_log))
    else:
        print(f"(EngineCore pid={child.pid}) INFO CPU KV cache size: 1,398,080 tokens, "
              "Maximum concurrency for 4,096 tokens per request: 341.33x", flush=True)
    print(f"(APIServer pid={os.getpid()}) INFO Application startup complete.", flush=True)
    if args.die_after is not None and not (args.die_once and Path(args.die_once).exists()):
        if args.die_once:
            Path(args.die_once).touch()
        time.sleep(args.die_after)
        child.kill()
        emit(LOGS / "cpu_engine_died.log")
        return 1
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
