"""Collect a stalled engine's thread stacks before it is restarted, bounded in time and size.

Two sources, the engine's own first:
- vLLM 0.33+ with `--watchdog-config '{"dump_dir": DIR}'` appends a numbered dump of every thread
  (faulthandler's form) to DIR/VLLM_STACK_DUMP_for_{engine_N|worker_N}_{pid}.log when its main loop
  is not fed in time and when the engine core gets SIGTERM (vllm/utils/watch_dog.py,
  vllm/v1/engine/core.py): the last dump of each of the engine's pids is read;
- `py-spy dump --pid PID` where py-spy is installed (it needs ptrace rights over the engine: root, or
  the engine's user with kernel.yama.ptrace_scope 0), each within what is left of the time given.

The text goes to diagnosis/stall_stacks.py (pure), which says where the engine is stuck.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvwatch.boundary.bounded_read import open_regular
from kvwatch.errors import CommandError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.values.json_text import parse_json

MAX_DUMP_BYTES = 1 << 20      # one process's stacks: a few KB; a runaway recursion is cut here
_DUMP_FILE = re.compile(r"^VLLM_STACK_DUMP_for_(.+)_(\d+)\.log$")
_DUMP_START = ">>> Call stack dump #"


@dataclass(frozen=True)
class StackText:
    process: str               # "engine_0 pid 300", "pid 310"
    source: str                # "vllm" (its own dump) or "py-spy"
    text: str                  # "" when it failed
    error: str | None = None   # why there is no text


def vllm_dump_dir(command: EngineCommand) -> str | None:
    """The dump_dir of the command's --watchdog-config (its JSON form, or --watchdog-config.dump_dir);
    None when vLLM dumps nothing."""
    argv = list(command.argv)
    for i, token in enumerate(argv):
        if token.startswith("--watchdog-config.dump_dir"):
            value = token.split("=", 1)[1] if "=" in token else (argv[i + 1] if i + 1 < len(argv) else "")
            return value or None
    try:
        raw = command.get("--watchdog-config")
    except CommandError:   # a command the release's parser cannot read: no dump dir known
        return None
    try:
        config = parse_json(raw) if raw else None
    except ValueError:
        return None
    directory = config.get("dump_dir") if isinstance(config, dict) else None
    return directory if isinstance(directory, str) and directory else None


def vllm_dumps(dump_dir: str, pids: Iterable[int], newer_than: float | None = None) -> list[StackText]:
    """The last dump in each of the pids' VLLM_STACK_DUMP files (written after `newer_than`, a wall
    time, when given). Regular files only, the last MAX_DUMP_BYTES of each: never a FIFO's wait."""
    wanted = set(pids)
    try:
        names = sorted(os.listdir(dump_dir))
    except OSError:
        return []
    out = []
    for name in names:
        match = _DUMP_FILE.match(name)
        if match is None or int(match.group(2)) not in wanted:
            continue
        process = f"{match.group(1)} pid {match.group(2)}"
        try:
            text = _tail(os.path.join(dump_dir, name), newer_than)
        except (OSError, ValueError) as exc:
            out.append(StackText(process, "vllm", "", f"{name}: {getattr(exc, 'strerror', None) or exc}"))
            continue
        if text is not None:
            start = text.rfind(_DUMP_START)
            out.append(StackText(process, "vllm", text[start:] if start >= 0 else text))
    return out


def _tail(path: str, newer_than: float | None) -> str | None:
    with open_regular(path, follow_symlinks=False) as (f, info):
        if newer_than is not None and info.st_mtime < newer_than:
            return None
        f.seek(max(0, info.st_size - MAX_DUMP_BYTES))
        return f.read(MAX_DUMP_BYTES).decode("utf-8", "replace")


def py_spy_dump(pid: int, timeout: float, executable: str | None = None) -> StackText:
    """`py-spy dump --pid PID`, killed after `timeout` seconds."""
    process = f"pid {pid}"
    spy = executable or shutil.which("py-spy")
    if spy is None:
        return StackText(process, "py-spy", "", "py-spy is not installed")
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, timeout=max(timeout, 0.1),
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return StackText(process, "py-spy", "", f"py-spy: no answer within {timeout:.1f}s")
    except OSError as exc:
        return StackText(process, "py-spy", "", f"py-spy: {exc.strerror or exc}")
    text = done.stdout[:MAX_DUMP_BYTES].decode("utf-8", "replace")
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return StackText(process, "py-spy", text, f"py-spy exited {done.returncode}" + (f": {said[-1]}" if said else ""))
    return StackText(process, "py-spy", text)


def collect(pids: Sequence[int], timeout: float, dump_dir: str | None = None, newer_than: float | None = None,
            py_spy: str | None = None) -> list[StackText]:
    """Every pid's stacks within `timeout` seconds in all: vLLM's own dump where `dump_dir` holds one
    for it, py-spy for the others (where installed; else one StackText saying so)."""
    out = [d for d in vllm_dumps(dump_dir, pids, newer_than) if d.text] if dump_dir else []
    dumped = {int(d.process.rsplit(" ", 1)[1]) for d in out}
    deadline = time.monotonic() + timeout
    spy = py_spy or shutil.which("py-spy")
    rest = [p for p in pids if p not in dumped]
    if rest and spy is None:
        return [*out, StackText(", ".join(f"pid {p}" for p in rest), "py-spy", "", "py-spy is not installed")]
    for pid in rest:
        left = deadline - time.monotonic()
        if left <= 0:
            out.append(StackText(f"pid {pid}", "py-spy", "", f"not read: {timeout:.1f}s spent"))
            continue
        out.append(py_spy_dump(pid, left, spy))
    return out
