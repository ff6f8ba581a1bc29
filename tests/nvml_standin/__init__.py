"""A real libnvidia-ml.so.1 stand-in for tests: build it, script its state, use it.

``fake_nvml.c`` is compiled against NVIDIA's own ``nvml.h`` (from the
nvidia-nvml-dev wheel) into ``libnvidia-ml.so.1``; the real nvidia-ml-py
(``pynvml``) loads it through kvwatch's library-path option. The fake driver
re-reads its state file on every call, so a test rewrites the file
(:meth:`NvmlStandin.write`) and the next NVML call sees the new GPUs,
processes or injected errors, in this process or in a child.

Use from a test module (tests/ is on sys.path; this is a package there)::

    from nvml_standin import StandinGpu, StandinProcess, StandinState
    from nvml_standin import nvml_standin_fixture  # noqa: F401  (registers "nvml_standin")

    def test_x(nvml_standin):
        nvml_standin.write(StandinState(gpus=[StandinGpu(uuid="GPU-1234...")]))
        ...  # kvwatch.boundary.nvml.Nvml() now sees that GPU; subprocesses get nvml_standin.env

The library is built once per source/header/compiler and cached under the
temp dir, so a session pays for one compile at most. Without a C compiler or
nvml.h the fixture skips, saying which is missing.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("fake_nvml.c")
SONAME = "libnvidia-ml.so.1"
STATE_ENV = "NVML_STANDIN_STATE"
CALLS_ENV = "NVML_STANDIN_CALLS"
LIBRARY_ENV = "KVWATCH_NVML_LIBRARY"  # read by kvwatch.boundary.nvml
GIB = 1 << 30


class StandinUnavailable(RuntimeError):
    """No C compiler or no nvml.h: the stand-in cannot be built here."""


def find_nvml_header_dir() -> Path:
    """The directory holding NVIDIA's nvml.h: $NVML_INCLUDE_DIR, the
    nvidia-nvml-dev wheel (nvidia/cu13/include or nvidia/nvml_dev/include),
    or a CUDA toolkit."""
    candidates: list[Path] = []
    if os.environ.get("NVML_INCLUDE_DIR"):
        candidates.append(Path(os.environ["NVML_INCLUDE_DIR"]))
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        for base in nvidia.__path__:
            found = [*Path(base).glob("*/include/nvml.h"), *Path(base).glob("*/*/include/nvml.h")]
            candidates.extend(sorted((h.parent for h in found), reverse=True))
    except ImportError:
        pass
    candidates += [Path("/usr/local/cuda/include"), Path("/usr/include")]
    for directory in candidates:
        if (directory / "nvml.h").is_file():
            return directory
    raise StandinUnavailable("nvml.h not found: pip install nvidia-nvml-dev (or set NVML_INCLUDE_DIR)")


def build_standin(cache_dir: Path | str | None = None) -> Path:
    """Compile fake_nvml.c into <cache_dir>/<hash>/libnvidia-ml.so.1 (cached).

    The hash covers the source, the header and the command, so an edit
    rebuilds. The file is compiled under a temporary name and renamed, so
    concurrent sessions never load a half-written library.
    """
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise StandinUnavailable("no C compiler (cc) on PATH")
    include = find_nvml_header_dir()
    flags = ["-shared", "-fPIC", "-O1", "-Wall", f"-Wl,-soname,{SONAME}",
             "-DNVML_NO_UNVERSIONED_FUNC_DEFS", f"-I{include}"]
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update((include / "nvml.h").read_bytes())
    digest.update(" ".join([compiler, *flags]).encode())
    base = Path(cache_dir or tempfile.gettempdir())
    out_dir = base / f"kvwatch-nvml-standin-{digest.hexdigest()[:16]}"
    library = out_dir / SONAME
    if library.is_file():
        return library
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f".{SONAME}.{os.getpid()}"
    result = subprocess.run([compiler, *flags, "-o", str(partial), str(SOURCE), "-lpthread"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the NVML stand-in failed:\n{result.stderr}")
    os.replace(partial, library)
    return library


@functools.cache
def standin_library() -> Path:
    """The stand-in for this process: one path per process, because kvwatch
    (like any NVML user) can load only one libnvidia-ml.so.1 per process."""
    return build_standin()


@dataclass
class StandinProcess:
    pid: int
    used_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE


@dataclass
class StandinGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 80 * GIB
    memory_used_bytes: int = 0  # v2 "used"; v1 reports used + reserved
    memory_reserved_bytes: int = 0
    compute_capability: tuple[int, int] = (9, 0)
    processes: Sequence[StandinProcess] = ()
    # call -> NVML error name, e.g. {"memory": "NOT_SUPPORTED"}; calls in fake_nvml.c
    errors: Mapping[str, str] = field(default_factory=dict)
    lost: bool = False  # every call on this GPU (handle included) returns GPU_IS_LOST


@dataclass
class StandinState:
    gpus: Sequence[StandinGpu] = ()
    driver_version: str = "570.124.06"
    init_error: str | None = None  # e.g. "DRIVER_NOT_LOADED": nvmlInit fails
    # global: {"count": "UNKNOWN"}; a per-device call here applies to every GPU
    errors: Mapping[str, str] = field(default_factory=dict)

    def render(self) -> str:
        lines = ["# kvwatch NVML stand-in state (see tests/nvml_standin/fake_nvml.c)",
                 f"driver {_token(self.driver_version)}"]
        if self.init_error:
            lines.append(f"error * init {_token(self.init_error)}")
        lines += [f"error * {_token(call)} {_token(code)}" for call, code in self.errors.items()]
        for index, gpu in enumerate(self.gpus):
            if "\n" in gpu.name or not gpu.name.strip():
                raise ValueError(f"bad GPU name {gpu.name!r}")
            major, minor = gpu.compute_capability
            lines.append(f"gpu {index} {_token(gpu.uuid)} {major} {minor} {gpu.memory_total_bytes} "
                         f"{gpu.memory_used_bytes} {gpu.memory_reserved_bytes} {gpu.name}")
            lines += [f"proc {index} {p.pid} {'NA' if p.used_bytes is None else p.used_bytes}"
                      for p in gpu.processes]
            lines += [f"error {index} {_token(call)} {_token(code)}"
                      for call, code in gpu.errors.items()]
            if gpu.lost:
                lines.append(f"error {index} * GPU_IS_LOST")
        return "\n".join(lines) + "\n"

    def write(self, path: Path | str) -> None:
        """Replace the state file atomically: a reader sees old or new, never half."""
        path = Path(path)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(self.render())
        os.replace(partial, path)


def _token(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} must be one non-empty word")
    return value


def default_state() -> StandinState:
    """What the fixture starts with: one idle H100."""
    return StandinState(gpus=[StandinGpu(uuid="GPU-5a1c0e1e-7d3b-4a8e-9c61-0b9f0d2c3e41")])


@dataclass
class NvmlStandin:
    """What the ``nvml_standin`` fixture gives a test."""

    library: Path
    state_path: Path
    calls_path: Path

    def write(self, state: StandinState) -> None:
        state.write(self.state_path)

    def calls(self) -> list[str]:
        """NVML entry points called so far (by this process and its children)."""
        try:
            return self.calls_path.read_text().split()
        except FileNotFoundError:
            return []

    def clear_calls(self) -> None:
        self.calls_path.unlink(missing_ok=True)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a child process that should see the stand-in."""
        return {STATE_ENV: str(self.state_path), CALLS_ENV: str(self.calls_path),
                LIBRARY_ENV: str(self.library)}


@pytest.fixture(name="nvml_standin")
def nvml_standin_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlStandin:
    """A fresh state file (one idle H100) for this test, the session's stand-in
    library, and the env (NVML_STANDIN_STATE, NVML_STANDIN_CALLS,
    KVWATCH_NVML_LIBRARY) set for this process and its children."""
    try:
        library = standin_library()
    except StandinUnavailable as exc:
        if os.environ.get("CI"):  # CI must run the NVML tests, never skip them
            pytest.fail(f"NVML stand-in unavailable: {exc} (scripts/test installs nvidia-nvml-dev)")
        pytest.skip(f"NVML stand-in unavailable: {exc}")
    standin = NvmlStandin(library=library, state_path=tmp_path / "nvml-state.txt",
                          calls_path=tmp_path / "nvml-calls.txt")
    standin.write(default_state())
    for name, value in standin.env.items():
        monkeypatch.setenv(name, value)
    # A new state file is a new host: the process's shared Nvml inits again on its next call, as
    # NVML enumerates the devices (handles, UUIDs) once per init and kvwatch keeps them for the init.
    from kvwatch.boundary.nvml import shared

    shared().shutdown()
    return standin


# The fixture is registered as "nvml_standin" under either import name;
# importing nvml_standin_fixture keeps linters from seeing test arguments
# named nvml_standin as redefinitions (F811).
nvml_standin = nvml_standin_fixture
