"""`kvwatch diagnose`: exit codes, JSON, human output, stdin, bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.diagnosis.diagnose import MAX_LINE_BYTES
from kvwatch.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNKNOWN_FAILURE

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
ROOT = Path(__file__).resolve().parents[1]


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["diagnose", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_json_with_a_command(capsys):
    code, out = run_json(capsys, str(LOGS / "cpu_block_size_8.log"), "--",
                         "python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--block-size", "8")
    assert code == EXIT_OK
    assert out["kind"] == "block_size_unsupported" and out["fatal"] is False
    assert "No common block size for 8" in out["evidence"]
    assert out["facts"]["backend_block_sizes"] == {"CPU_ATTN": ["MultipleOf(32)"]}
    assert out["remedy"]["set"] == {"--block-size": 32} and out["remedy"]["remove"] == []
    assert out["remedy"]["reason"]
    assert out["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
                              "--block-size", "32"]


def test_json_without_a_command_has_no_remedy_keys(capsys):
    code, out = run_json(capsys, str(LOGS / "cpu_max_model_len.log"))
    assert code == EXIT_OK
    assert set(out) == {"kind", "evidence", "facts", "fatal"}
    assert out["facts"]["estimated_max_model_len"] == 130944


def test_json_fatal_has_null_remedy(capsys):
    code, out = run_json(capsys, str(LOGS / "gpu_no_attention_backend_hw.log"), "--", "vllm", "serve", "/m")
    assert code == EXIT_OK and out["fatal"] is True
    assert out["remedy"] is None and out["command"] is None


def test_unknown_exits_1(tmp_path, capsys):
    log = tmp_path / "wrapper.log"
    log.write_text("RuntimeError: Engine core initialization failed. See root cause above. "
                   "Failed core proc(s): {}\n")
    code, out = run_json(capsys, str(log))
    assert code == EXIT_UNKNOWN_FAILURE and out["kind"] == "unknown"


def test_human_output(capsys):
    code = main(["diagnose", str(LOGS / "gpu_kernel_oor_sm120_fp8.log"), "--",
                 "vllm", "serve", "/m", "--kv-cache-dtype", "fp8"])
    text = capsys.readouterr().out
    assert code == EXIT_OK
    assert "kernel_out_of_resources" in text
    assert "--kv-cache-dtype auto" in text
    assert "vllm serve /m --kv-cache-dtype auto" in text
    assert len(text.splitlines()) <= 8


def test_served_flag(tmp_path, capsys):
    log = tmp_path / "crash.log"
    log.write_text("Segmentation fault (core dumped)\n")
    assert main(["diagnose", str(log)]) == EXIT_UNKNOWN_FAILURE
    capsys.readouterr()
    code, out = run_json(capsys, "--served", str(log), "--", "vllm", "serve", "/m")
    assert code == EXIT_OK and out["kind"] == "engine_died"
    assert out["remedy"] == {"set": {}, "remove": [], "reason": "restart with the same plan"}
    assert out["command"] == ["vllm", "serve", "/m"]


def _cli(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvwatch.cli", "diagnose", *argv], input=stdin,
                          capture_output=True, cwd=ROOT, timeout=60)


def test_stdin_and_exit_codes_in_a_real_process():
    proc = _cli("--json", "-", stdin=(LOGS / "gpu_memory_busy.log").read_bytes())
    assert proc.returncode == EXIT_OK
    assert json.loads(proc.stdout)["facts"]["free_gib"] == 19.77
    proc = _cli("-", stdin=b"\xff\xfe binary \x00 junk\n" * 100)
    assert proc.returncode == EXIT_UNKNOWN_FAILURE


@pytest.mark.parametrize("argv,needle", [
    (["/nonexistent/engine.log"], "cannot read /nonexistent/engine.log"),
    ([str(LOGS / "*.nomatch")], "no log matches"),                       # a glob of nothing (a directory is many logs)
    ([str(LOGS / "cpu_block_size_8.log"), "--", "vllm", "serve"], "names no model"),
    ([], "required"),
])
def test_bad_input_is_one_line_exit_2(argv, needle):
    proc = _cli(*argv)
    assert proc.returncode == EXIT_BAD_INPUT
    err = proc.stderr.decode()
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3 and err.strip().splitlines()[-1].startswith("kvwatch")


def test_a_giant_line_is_cut_and_the_scan_goes_on(tmp_path, capsys):
    log = tmp_path / "giant.log"
    with open(log, "wb") as out:
        out.write(b"x" * (MAX_LINE_BYTES * 3) + b" No available memory for the cache blocks\n")
        out.write(b"ValueError: No common block size for 8 (CPU_ATTN: [MultipleOf(32)]).\n")
    code, out = run_json(capsys, str(log))
    assert code == EXIT_OK and out["kind"] == "block_size_unsupported"


def test_diagnose_never_imports_vllm_or_torch():
    probe = ("import sys, contextlib, io\nfrom kvwatch.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             f"    main(['diagnose', {str(LOGS / 'cpu_block_size_8.log')!r}, '--', 'vllm', 'serve', '/m'])\n"
             "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


FIELD = Path(__file__).resolve().parent / "fixtures" / "field_logs"


def test_a_directory_gives_one_line_per_log(capsys, tmp_path):
    for name in ("lora_rank_swift_pasted.log", "port_errno98_pasted.log"):
        (tmp_path / name).write_bytes((FIELD / name).read_bytes())
    code = main(["diagnose", str(tmp_path), "--", "vllm", "serve", "m"])
    lines = capsys.readouterr().out.splitlines()
    assert code == EXIT_OK and len(lines) == 2
    assert "lora_rank_too_large" in lines[0] and "fix: --max-lora-rank 32" in lines[0]
    assert "port_in_use" in lines[1] and "FATAL" in lines[1] and "fix: none" in lines[1]


def test_a_glob_and_its_exit_code(capsys):
    code = main(["diagnose", str(FIELD / "unknown_*.log")])
    lines = capsys.readouterr().out.splitlines()
    assert code == EXIT_UNKNOWN_FAILURE and len(lines) == 3 and all("  unknown  " in line for line in lines)


def test_a_glob_as_json(capsys):
    code = main(["diagnose", "--json", str(FIELD / "nccl_*.log")])
    out = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK and [o["kind"] for o in out] == ["nccl_error"] * 3 and all(o["fatal"] for o in out)


def test_a_glob_that_matches_nothing(capsys, tmp_path):
    assert main(["diagnose", str(tmp_path / "*.log")]) == EXIT_BAD_INPUT
    assert "no log matches" in capsys.readouterr().err


def test_several_files_give_one_line_each_in_order(capsys):
    names = ("port_errno98_pasted.log", "lora_rank_swift_pasted.log")
    code = main(["diagnose", *(str(FIELD / n) for n in names)])
    lines = capsys.readouterr().out.splitlines()
    assert code == EXIT_OK and len(lines) == 2
    assert lines[0].startswith(str(FIELD / names[0])) and "port_in_use" in lines[0]
    assert "lora_rank_too_large" in lines[1]


def test_a_missing_file_among_several_is_one_clear_error():
    proc = _cli(str(FIELD / "port_errno98_pasted.log"), "/nonexistent/x.log")
    assert proc.returncode == EXIT_BAD_INPUT and "cannot read /nonexistent/x.log" in proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()


def test_stdin_among_files_and_only_once():
    proc = _cli(str(FIELD / "port_errno98_pasted.log"), "-", stdin=(LOGS / "gpu_memory_busy.log").read_bytes())
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == EXIT_OK and "port_in_use" in lines[0] and lines[1].startswith("-  gpu_memory_busy")
    proc = _cli("-", "-", stdin=b"")
    assert proc.returncode == EXIT_BAD_INPUT and "stdin (-) can be read once" in proc.stderr.decode()


def _interleaved(prefixes: tuple[str, str], engine_log: Path) -> bytes:
    """Two containers' lines as kubectl --all-containers --prefix interleaves them: a sidecar's
    health checks (an ERROR of its own among them) and the engine's log."""
    sidecar = [f"{prefixes[0]}INFO 12-05 10:00:{i:02d} proxy: upstream not ready, retrying" for i in range(30)]
    sidecar[5] = f"{prefixes[0]}ERROR 12-05 10:00:05 proxy: connect() failed (111: Connection refused)"
    engine = [prefixes[1] + line for line in engine_log.read_text().splitlines()]
    out: list[str] = []
    while sidecar or engine:
        out.extend(engine[:3])
        out.extend(sidecar[:1])
        engine, sidecar = engine[3:], sidecar[1:]
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("prefixes, tag", [
    (("[pod/vllm-0/proxy] ", "[pod/vllm-0/vllm] "), "pod/vllm-0/vllm"),      # kubectl logs --all-containers --prefix
    (("proxy-1  | ", "vllm-1  | "), "vllm-1"),                                 # docker compose logs
])
def test_a_multi_container_log_is_diagnosed_per_container(prefixes, tag, tmp_path, capsys):
    log = tmp_path / "pod.log"
    log.write_bytes(_interleaved(prefixes, LOGS / "cpu_block_size_8.log"))
    code = main(["diagnose", str(log), "--", "vllm", "serve", "m", "--block-size", "8"])
    lines = capsys.readouterr().out.splitlines()
    # the failing container only: the sidecar's error record names no failure of an engine
    assert code == EXIT_OK and len(lines) == 1 and f"[{tag}]" in lines[0]
    assert "block_size_unsupported" in lines[0] and "fix: --block-size 32" in lines[0]


def test_when_no_container_failed_each_is_reported(tmp_path, capsys):
    log = tmp_path / "pod.log"
    log.write_text("[pod/p/a] INFO 12-05 10:00:00 ready\n[pod/p/b] INFO 12-05 10:00:00 ready\n")
    assert main(["diagnose", str(log)]) == EXIT_UNKNOWN_FAILURE
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_a_multi_container_log_on_stdin_as_json():
    proc = _cli("--json", "-", stdin=_interleaved(("[pod/p/a] ", "[pod/p/vllm] "), LOGS / "gpu_memory_busy.log"))
    out = json.loads(proc.stdout)
    engine = next(o for o in out if o["log"] == "-[pod/p/vllm]")
    assert engine["kind"] == "gpu_memory_busy" and engine["facts"]["free_gib"] == 19.77
