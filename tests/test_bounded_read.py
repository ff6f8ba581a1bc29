"""The one bounded reader of user-given files: regular files only, size-capped, never blocking; and
every command that reads a user's file through it (a FIFO once hung `kvwatch run` at start-up)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kvwatch.boundary.bounded_read import FileTooLarge, NotRegularFile, check_regular, read_bounded


def _regular(d: Path) -> Path:
    (d / "f").write_bytes(b"abc")
    return d / "f"


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "f")
    return d / "f"


def _socket(d: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "f"))   # left bound until the test's end; the path is all the reader sees
    _SOCKETS.append(s)
    return d / "f"


def _link_to_regular(d: Path) -> Path:
    (d / "target").write_bytes(b"abc")
    (d / "f").symlink_to(d / "target")
    return d / "f"


def _link_to_fifo(d: Path) -> Path:
    os.mkfifo(d / "target")
    (d / "f").symlink_to(d / "target")
    return d / "f"


def _sparse_giant(d: Path) -> Path:
    with open(d / "f", "wb") as f:
        f.truncate(200 * 10**6)
    return d / "f"


_SOCKETS: list[socket.socket] = []

# (what the path is, follow symlinks, the bytes read, or the error and its message)
CASES: list[tuple[str, Callable[[Path], Path], bool, bytes | tuple[type[Exception], str]]] = [
    ("regular", _regular, True, b"abc"),
    ("regular, no follow", _regular, False, b"abc"),
    ("fifo", _fifo, True, (NotRegularFile, "not a regular file (a FIFO)")),
    ("directory", lambda d: d, True, (NotRegularFile, "not a regular file (a directory)")),
    ("char device", lambda d: Path("/dev/zero"), True, (NotRegularFile, "not a regular file (a character device)")),
    ("socket", _socket, True, (NotRegularFile, "not a regular file (a socket)")),
    ("link to regular", _link_to_regular, True, b"abc"),
    ("link to regular, no follow", _link_to_regular, False, (OSError, "")),
    ("link to fifo", _link_to_fifo, True, (NotRegularFile, "not a regular file (a FIFO)")),
    ("giant", _sparse_giant, True, (FileTooLarge, "larger than 1 MiB")),
    ("missing", lambda d: d / "nothing", True, (FileNotFoundError, "")),
]


@pytest.mark.parametrize("what, make, follow, expected", CASES, ids=[c[0] for c in CASES])
def test_the_reader_reads_regular_files_only_and_never_blocks(
        tmp_path: Path, what: str, make: Callable[[Path], Path], follow: bool,
        expected: bytes | tuple[type[Exception], str]) -> None:
    path = make(tmp_path)
    if isinstance(expected, bytes):
        assert read_bounded(path, 1 << 20, follow_symlinks=follow) == expected
        return
    error, message = expected
    with pytest.raises(error) as info:
        read_bounded(path, 1 << 20, follow_symlinks=follow)
    assert message in str(info.value)


def test_a_file_at_the_cap_is_read_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 100)
    assert read_bounded(tmp_path / "f", 100) == b"x" * 100
    with pytest.raises(FileTooLarge, match="larger than 99 bytes"):
        read_bounded(tmp_path / "f", 99)


def test_vet_sees_the_open_files_stat_before_a_byte_is_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    seen: list[int] = []

    def vet(info: os.stat_result) -> None:
        seen.append(info.st_size)
        raise PermissionError("not ours")

    with pytest.raises(PermissionError, match="not ours"):
        read_bounded(tmp_path / "f", 10, vet=vet)
    assert seen == [3]


def test_check_regular_refuses_a_fifo_for_a_library_that_opens_it_itself(tmp_path: Path) -> None:
    check_regular(_regular(tmp_path))
    with pytest.raises(NotRegularFile, match="FIFO"):
        check_regular(_fifo_in(tmp_path))


def _fifo_in(d: Path) -> Path:
    os.mkfifo(d / "g")
    return d / "g"


def _kvwatch(*args: str) -> subprocess.CompletedProcess[str]:
    # A subprocess with a timeout: a reader that blocks fails the test instead of hanging it.
    return subprocess.run([sys.executable, "-m", "kvwatch.cli", *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def _one_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("kvwatch: ")]   # not the log lines
    assert len(lines) == 1, result.stderr
    assert all(n in lines[0] for n in needles), lines[0]


def test_a_fifo_as_the_config_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    _one_line(_kvwatch("run", "--config", str(fifo), "--", "vllm", "serve", str(tmp_path)),
              str(fifo), "not a regular file (a FIFO)")


def test_a_fifo_as_the_web_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    _one_line(_kvwatch("export", "--engine-url", "http://127.0.0.1:9", "--web-config", str(fifo), "--listen", "127.0.0.1:0"),
              str(fifo), "not a regular file (a FIFO)")


def test_a_fifo_as_the_models_config_json_is_one_line_and_exit_2(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    _one_line(_kvwatch("plan", "--device", "cpu", "--", "vllm", "serve", str(tmp_path)),
              str(fifo), "not a regular file (a FIFO)")


def test_a_fifo_as_a_tls_key_is_refused_before_openssl_opens_it(tmp_path: Path) -> None:
    from kvwatch.errors import ConfigError
    from kvwatch.exporter.web_config import TlsConfig

    fifo = _fifo(tmp_path)
    with pytest.raises(ConfigError, match="not a regular file \\(a FIFO\\)"):
        TlsConfig(cert_file=fifo, key_file=fifo).context()


def test_diagnose_reads_a_pipe_but_refuses_a_device_that_never_ends(tmp_path: Path) -> None:
    _one_line(_kvwatch("diagnose", "/dev/zero"), "/dev/zero", "not a log (a character device)")
    fifo = _fifo(tmp_path)   # `kvwatch diagnose <(journalctl ...)`: a pipe is a log streamed
    log = (Path(__file__).parent / "fixtures" / "logs" / "cpu_engine_died.log").read_bytes()

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(log)

    writer = threading.Thread(target=feed)
    writer.start()
    result = _kvwatch("diagnose", str(fifo))
    writer.join(10)
    assert "engine_died" in result.stdout, result.stderr
