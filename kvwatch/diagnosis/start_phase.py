"""How far an engine's start had come, from its own progress lines (pure).

A kill says nothing of where it struck; the log does: the last progress line vLLM printed names the
phase. The watchdog counts repeated host OOM kills per phase (a kill while loading weights twice is a
pattern; one while loading and one while serving is not) and names the phase in the failure.
The markers are INFO lines every release from 0.8 to 0.33 prints (model_runner.py, gpu_model_runner.py,
default_loader.py, worker.py, api_server.py); the last one found wins.
"""
from __future__ import annotations

from collections.abc import Iterable

STARTING = "starting"
LOADING = "loading weights"
PROFILING = "profiling memory"
CAPTURING = "capturing CUDA graphs"
SERVING = "serving"

# (substring, the phase it begins): order does not matter, the last line that holds one does.
_MARKERS: tuple[tuple[str, str], ...] = (
    ("Starting to load model", LOADING),
    ("Loading weights took", PROFILING),          # loaded: the profile's dummy forward comes next
    ("Model loading took", PROFILING),
    ("Memory profiling takes", PROFILING),
    ("Available KV cache memory", PROFILING),
    ("Capturing CUDA graph", CAPTURING),
    ("Capturing cudagraphs", CAPTURING),
    ("Graph capturing finished", STARTING),       # the API server's own start is left
    ("Starting vLLM API server", SERVING),
    ("Application startup complete", SERVING),
)


def phase_of(lines: Iterable[str]) -> str:
    """The phase the engine's output had reached: STARTING when no progress line was printed."""
    phase = STARTING
    for line in lines:
        for marker, begins in _MARKERS:
            if marker in line:
                phase = begins
    return phase
