"""`kvwatch --help` and `kvwatch plan` stay light: no vllm, torch, transformers, NVML or psutil."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KIMI = str(Path(__file__).resolve().parent.parent / "examples" / "kimi-k2")
PROBE = ("import sys, json, contextlib, io\n"
         "from kvwatch.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    try:\n        main(json.loads(sys.argv[1]))\n    except SystemExit:\n        pass\n"
         "print(json.dumps(sorted(m for m in ('vllm', 'torch', 'transformers', 'pynvml', 'psutil') if m in sys.modules)))")


@pytest.mark.parametrize("args", [
    ["--help"],
    ["plan", "--preset", "h200", "--", "vllm", "serve", KIMI, "--kv-cache-memory-bytes", "40G"],
    ["plan", "--device", "cpu", "--", "vllm", "serve", KIMI],
])
def test_no_heavy_imports(args):
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("module", ["kvwatch.exporter.collector", "kvwatch.exporter.snapshot", "kvwatch.gpu_types",
                                    "kvwatch.watchdog.gpu_view"])
def test_the_gpu_value_types_do_not_load_nvml(module: str) -> None:
    """GpuInfo and NvmlSnapshot live in kvwatch/gpu_types.py: rendering them never loads pynvml."""
    probe = f"import sys, {module}\nprint('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
