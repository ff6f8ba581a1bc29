"""Any engine command and any config.json: a plan, or one line and exit 2 (3: vLLM will refuse it),
never a traceback (issue 15, item 5). Property-based over the flags kvwatch reads and the fields
of config.json it reads, with values of every JSON type and size."""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.cli import main

FLAGS = ["--block-size", "--kv-cache-dtype", "--dtype", "--gpu-memory-utilization", "--kv-cache-memory-bytes",
         "--max-model-len", "--max-num-seqs", "--tensor-parallel-size", "--pipeline-parallel-size",
         "--data-parallel-size", "--num-gpu-blocks-override", "--attention-backend", "--max-num-batched-tokens",
         "-tp", "-pp", "-dp", "--kv-cache-memory", "--port", "--host"]
FIELDS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
          "max_position_embeddings", "model_type", "sliding_window", "layer_types", "rope_scaling",
          "torch_dtype", "kv_lora_rank", "qk_rope_head_dim", "model_max_length", "text_config",
          "use_sliding_window", "max_window_layers", "rope_parameters", "vocab_size", "intermediate_size"]
NUMBERS = st.one_of(st.integers(min_value=-10, max_value=10), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, 16, 32, 128, 1e40, 10**8, 10**12, 10**40, 2**63]))
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4)),
    max_leaves=12)
FLAG_VALUES = st.one_of(st.integers(min_value=-2**40, max_value=2**40).map(str),
                        st.sampled_from(["0", "-1", "auto", "nan", "inf", "-inf", "1e400", "7", "0.9", "fp8",
                                         "auto", "10G", "1Gi", "", "x", "\x00", "1" * 400]),
                        st.text(max_size=12))
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096}


def run_plan(config: object, flags: list[str]) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config, allow_nan=True))
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["plan", "--device", "cpu", "--json", "--", "vllm", "serve", tmp, *flags])
        return code, err.getvalue()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6),
       st.lists(st.tuples(st.sampled_from(FLAGS), FLAG_VALUES), max_size=4))
def test_any_config_and_flags_give_a_plan_or_one_line(overrides: dict, flag_pairs: list) -> None:
    config = {**BASE, **overrides}
    flags = [token for pair in flag_pairs for token in pair]
    code, err = run_plan(config, flags)      # an exception other than kvwatch's own fails the test here
    assert code in (0, 2, 3), (code, err)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("kvwatch: "), err
    assert "Traceback" not in err


@settings(max_examples=100, deadline=None)
@given(JSON_VALUES)
def test_any_json_document_as_config(document: object) -> None:
    code, err = run_plan(document, [])
    assert code in (0, 2, 3) and "Traceback" not in err


# The table of bad values, each one line and exit 2 (or 3 with the fix where vLLM refuses it).
BAD_FLAGS = [
    (["--block-size", "0"], 3), (["--block-size", "-16"], 3),
    (["--gpu-memory-utilization", "nan"], 3), (["--gpu-memory-utilization", "inf"], 3),
    (["--gpu-memory-utilization", "7"], 3),
    (["--tensor-parallel-size", "0"], 2), (["--max-model-len", "0"], 2), (["--max-num-seqs", "-1"], 2),
    (["--kv-cache-memory-bytes", "-5"], 2), (["--data-parallel-size", "0"], 2), (["--tensor-parallel-size", "x"], 2),
]
BAD_CONFIGS = [
    {"num_hidden_layers": 10**12}, {"num_hidden_layers": 10**40}, {"num_hidden_layers": 10**8},
    {"num_hidden_layers": 1e12}, {"head_dim": True}, {"num_key_value_heads": 10**30}, {"head_dim": -64},
    {"model_type": 5},
]


def test_the_bad_value_table() -> None:
    for flags, expected in BAD_FLAGS:
        code, err = run_plan(BASE, flags)
        assert code == expected, (flags, code, err)
        if code == 2:
            assert err.count("\n") == 1 and err.startswith("kvwatch: "), (flags, err)
    for override in BAD_CONFIGS:
        code, err = run_plan({**BASE, **override}, [])
        assert code == 2 and err.count("\n") == 1, (override, code, err)
    deep = tempfile.mkdtemp()
    (Path(deep) / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["plan", "--device", "cpu", "--", "vllm", "serve", deep]) == 2
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["plan", "--device", "cpu", "--", "vllm", "serve", "/tmp/" + "a" * 5000]) == 2


def test_diagnose_never_sends_a_logs_control_characters_to_the_terminal(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"ValueError: No common block size for 8 \x1b]0;pwned\x07\x1b[2J\r (CPU_ATTN: [MultipleOf(32)])\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["diagnose", str(log)]) == 0
    text = out.getvalue()
    assert not any(c in text for c in "\x1b\x07\r"), repr(text)
    assert "block_size_unsupported" in text


def test_engine_url_credentials_are_refused_not_logged() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["export", "--engine-url", "http://admin:hunter2@127.0.0.1:8000", "--no-nvml"]) == 2
    assert "hunter2" not in err.getvalue() and err.getvalue().count("\n") == 1


# -- the TOML config and the web config (issue 15, item 5) ----------------------------------------------

@pytest.mark.parametrize("toml,message", [
    ('[engine]\ncommand = ["vllm", "serve", "m"]\nenvironment = { "A=B" = "1" }\n', "environment"),
    ('[engine]\ncommand = ["vllm", "serve", "m\\u0000x"]\n', "NUL"),
    ('[engine]\ncommand = ["vllm", "serve", "m"]\nstop_timeout_seconds = inf\n', "finite"),
    ('[engine]\ncommand = ["vllm", "serve", "m"]\nstart_timeout_seconds = nan\n', "finite"),
    ('name = "a"\x00\n', "k.toml"),
])
def test_bad_toml_values_are_one_line(tmp_path: Path, toml: str, message: str) -> None:
    from kvwatch.errors import ConfigError
    from kvwatch.watchdog.config import load_config
    path = tmp_path / "k.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_an_empty_state_dir_is_refused() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["run", "--state-dir", "", "--", "vllm", "serve", "m"]) == 2
    assert "--state-dir" in err.getvalue()


@pytest.mark.parametrize("content", [
    b"basic_auth_users:\n  u: '$2y$10$notahash'\n",
    b"\xff\xfe\x00binary\x00",
])
def test_bad_web_configs_are_one_line(tmp_path: Path, content: bytes) -> None:
    from kvwatch.errors import ConfigError
    from kvwatch.exporter.web_config import load_web_config
    path = tmp_path / "web.yml"
    path.write_bytes(content)
    with pytest.raises(ConfigError):
        load_web_config(path)


def test_an_encrypted_key_never_asks_for_a_pass_phrase(tmp_path: Path) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from kvwatch.errors import ConfigError
    from kvwatch.exporter.web_config import load_web_config
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvwatch")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "k.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n")
    config = load_web_config(tmp_path / "web.yml")
    with pytest.raises(ConfigError, match="TLS certificate or key"):
        config.tls.context()


QWEN2_VL = {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
            "intermediate_size": 256, "vision_config": {"embed_dim": 64, "hidden_size": 128, "patch_size": 14,
                                                        "spatial_merge_size": 2, "depth": 2}}


@pytest.mark.parametrize("ratio", [float("nan"), float("inf"), -float("inf"), 1e308 * 10, True, "4"])
def test_a_vision_mlp_ratio_that_is_no_number_is_the_default(ratio: object) -> None:
    """json.loads reads NaN and Infinity; a vision tower's mlp_ratio of them (or of the wrong type)
    is transformers' default 4, not an OverflowError from the weights' count or the encoder's pass."""
    config = {**QWEN2_VL, "vision_config": {**QWEN2_VL["vision_config"], "mlp_ratio": ratio}}
    for preset in ("h100", "cpu"):
        device = ["--device", "cpu"] if preset == "cpu" else ["--preset", preset, "--vllm-version", "0.28.0"]
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(config, allow_nan=True))
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                code = main(["plan", *device, "--json", "--", "vllm", "serve", tmp])
        assert code in (0, 3) and "Traceback" not in err.getvalue(), (preset, code, err.getvalue())


def _with(config: dict, path: tuple[str, ...], value: object) -> dict:
    out = json.loads(json.dumps(config))
    inner = out
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return out


def _newest_configs() -> dict[str, dict]:
    from fixtures.models.newest import NEWEST
    from test_glm5_next import CASES as GLM5
    from test_mtp_draft import GLM45_AIR
    return {"deepseek_v4_flash": NEWEST["deepseek_v4_flash"]["config"],
            "deepseek_v41_flash": NEWEST["deepseek_v41_flash"]["config"],
            "hrm_text_1b": NEWEST["hrm_text_1b"]["config"],
            "glm5_next": next(iter(GLM5.values()))["config"], "glm45_air": GLM45_AIR}


# Values a fuzz of this session's new config readers found reaching a traceback (a set lookup of a list,
# a division by a zero size, a list of 10**15 MTP layers): now one line and exit 2, or a plan.
@pytest.mark.parametrize("model,path,value,codes", [
    ("deepseek_v4_flash", ("rope_scaling", "type"), [], (0, 3)),
    ("hrm_text_1b", ("rope_parameters", "rope_type"), {}, (0, 3)),
    ("deepseek_v41_flash", ("text_config", "head_dim"), 0, (2,)),
    ("deepseek_v41_flash", ("text_config", "rope_scaling", "rope_type"), [], (0, 3)),
    ("glm5_next", ("index_head_dim",), 0, (2,)),
    ("glm5_next", ("index_kpool",), 0, (2,)),
    ("glm5_next", ("model_type",), [], (2,)),
    ("glm45_air", ("num_nextn_predict_layers",), 10**15, (2,)),
])
def test_the_newest_readers_give_a_plan_or_one_line(model: str, path: tuple[str, ...], value: object,
                                                     codes: tuple[int, ...]) -> None:
    code, err = run_plan(_with(_newest_configs()[model], path, value), [])
    assert code in codes, (code, err)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("kvwatch: "), err


@pytest.mark.parametrize("flag", ["--limit-mm-per-prompt", "--speculative-config", "--compilation-config",
                                  "--additional-config", "--hf-overrides"])
@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, '{"a": ' + "[" * 5000 + "]" * 5000 + "}"])
def test_json_flags_nested_too_deep_give_a_plan_or_one_line(flag: str, value: str) -> None:
    """json.loads recurses into nested arrays: a few thousand brackets raised RecursionError through every
    `except ValueError` around it (values/json_text.parse_json now says ValueError)."""
    code, err = run_plan(BASE, [flag, value])
    assert code in (0, 2, 3), (code, err[-300:])
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("kvwatch: "), err[-300:]
