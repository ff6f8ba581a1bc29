"""A pooling run's memory profile: vLLM's runner and convert resolution, no sampler pass, the pooler's
peak, no LM head for a converted model (planner/pooling_run.py)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from test_weight_files import write_safetensors
from vllm_sources import release_tree

from kvwatch.boundary.model_source import load_model_source
from kvwatch.boundary.plan_loader import plan_command
from kvwatch.planner.devices import GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.gpu_budget import estimate_budget, forward_pass_bytes
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.pooling_run import (
    GENERATE,
    HEAD_DTYPE_BYTES,
    PoolingRun,
    lm_head_params,
    pooler_peak_bytes,
    pooling_run,
    registered_runners,
    sentence_transformers_pooling,
    suffix_defaults,
)
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.weights import count_weights
from kvwatch.values.versions import parse_version

RECORD = Path(__file__).parent / "fixtures" / "pooling_suffix_tables.json"
H100 = preset("h100")
V0_19 = parse_version("0.19.1")
# Qwen3-Embedding-8B's config.json (architectures Qwen3ForCausalLM, untied embeddings)
QWEN3_EMBEDDING_8B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
                      "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151665, "tie_word_embeddings": False,
                      "max_position_embeddings": 40960, "torch_dtype": "bfloat16", "rope_theta": 1000000}


def suffix_table(tree: Path) -> list[list[str]]:
    """`_SUFFIX_TO_DEFAULTS` as the release's own source spells it (config/model.py; 0.10.2: config/__init__.py)."""
    for rel in ("vllm/config/model.py", "vllm/config/__init__.py"):
        path = tree / rel
        if not path.exists():
            continue
        for node in ast.parse(path.read_text()).body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) else None)
            if isinstance(target, ast.Name) and target.id == "_SUFFIX_TO_DEFAULTS" and node.value is not None:
                return [[s, r, c] for s, (r, c) in ast.literal_eval(node.value)]
    raise AssertionError(f"no _SUFFIX_TO_DEFAULTS under {tree}")


RECORDED: dict[str, list[list[str]]] = json.loads(RECORD.read_text())


@pytest.mark.parametrize("release", sorted(RECORDED))
def test_the_suffix_table_is_the_releases(release: str) -> None:
    assert [list(row) for row in suffix_defaults(parse_version(release).parts)] == RECORDED[release]


@pytest.mark.parametrize("release", sorted(RECORDED))
def test_the_recorded_suffix_table_is_read_from_the_release(release: str) -> None:
    tree = release_tree(release)
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (KVWATCH_VLLM_SRC)")
    assert suffix_table(tree) == RECORDED[release]


R32 = registered_runners("0.32.0")


@pytest.mark.parametrize(("runner", "convert", "archs", "st", "release", "expected"), [
    # a generative checkpoint stays generative
    ("auto", "auto", ("Qwen3ForCausalLM",), False, "0.19.1", ("generate", "none")),
    # Qwen3-Embedding-8B: a Sentence Transformers config, or --runner pooling: converted to embed
    ("auto", "auto", ("Qwen3ForCausalLM",), True, "0.19.1", ("pooling", "embed")),
    ("pooling", "auto", ("Qwen3ForCausalLM",), False, "0.19.1", ("pooling", "embed")),
    ("pooling", "classify", ("Qwen3ForCausalLM",), False, "0.19.1", ("pooling", "classify")),
    # registered pooling classes run as they are
    ("auto", "auto", ("BertModel",), False, "0.32.0", ("pooling", "none")),
    ("auto", "auto", ("Qwen2ForRewardModel",), False, "0.32.0", ("pooling", "none")),
    ("auto", "auto", ("JinaForRanking",), False, "0.32.0", ("pooling", "none")),
    # registered under a pooling name, built from a generative class: vLLM asks the class
    ("auto", "auto", ("LlamaModel",), False, "0.32.0", ("generate", "none")),
    ("auto", "auto", ("LlavaNextForConditionalGeneration",), False, "0.32.0", ("generate", "none")),
    # a registered multimodal model named *Model stays generative
    ("auto", "auto", ("UltravoxModel",), False, "0.32.0", ("generate", "none")),
    # unregistered names: the suffix table
    ("auto", "auto", ("FooForSequenceClassification",), False, "0.19.1", ("pooling", "classify")),
    ("auto", "auto", ("FooForTokenClassification",), False, "0.19.1", ("pooling", "classify")),
    ("auto", "auto", ("FooForTokenClassification",), False, "0.12.0", ("generate", "none")),
    ("auto", "auto", ("FooRewardModel",), False, "0.12.0", ("pooling", "reward")),
    ("auto", "auto", ("FooRewardModel",), False, "0.13.0", ("pooling", "embed")),
    ("auto", "auto", ("FooModel",), False, "0.19.1", ("pooling", "embed")),
    ("auto", "auto", ("FooForCausalLM",), False, "0.19.1", ("generate", "none")),
    ("auto", "auto", ("Foo",), False, "0.19.1", ("generate", "none")),
    ("pooling", "auto", ("Foo",), False, "0.19.1", ("pooling", "embed")),
    # before --runner (0.10.2) kvwatch plans a generative run
    ("pooling", "auto", ("Qwen3ForCausalLM",), False, "0.9.2", ("generate", "none")),
])
def test_the_runner_and_convert_as_vllm_resolves_them(runner: str, convert: str, archs: tuple[str, ...], st: bool,
                                                        release: str, expected: tuple[str, str]) -> None:
    version = parse_version(release)
    run = pooling_run(runner, convert, archs, registered_runners(release), st, version.parts)
    assert (run.runner, run.convert) == expected


@pytest.mark.parametrize(("run", "embedding_params", "release", "head"), [
    (PoolingRun("pooling", "embed"), 2 * 1000 * 64, "0.19.1", 1000 * 64),      # untied: the head goes
    (PoolingRun("pooling", "classify"), 2 * 1000 * 64, "0.19.1", 1000 * 64),
    (PoolingRun("pooling", "embed"), 1000 * 64, "0.19.1", 0),                  # tied: the input embedding stays
    (PoolingRun("pooling", "none"), 2 * 1000 * 64, "0.19.1", 0),               # a native pooling class
    (GENERATE, 2 * 1000 * 64, "0.19.1", 0),
    (PoolingRun("pooling", "embed"), 2 * 1000 * 64, "0.14.1", 0),              # built, then deleted: not planned
    (PoolingRun("pooling", "embed"), 2 * 1000 * 64, "0.15.1", 1000 * 64),
])
def test_a_converted_model_loads_no_lm_head(run: PoolingRun, embedding_params: int, release: str, head: int) -> None:
    assert lm_head_params(run, 1000, 64, embedding_params, parse_version(release).parts) == head


@pytest.mark.parametrize(("run", "peak"), [
    (GENERATE, 0),
    (PoolingRun("pooling", "embed"), 8192 * (4096 * 2 + 4096 * HEAD_DTYPE_BYTES)),   # token_embed, fp32 head
    (PoolingRun("pooling", "none"), 8192 * (4096 * 2 + 4096 * HEAD_DTYPE_BYTES)),
    (PoolingRun("pooling", "classify"), 8192 * (4096 * 2 + 3 * HEAD_DTYPE_BYTES)),   # token_classify: labels
])
def test_the_poolers_peak_is_the_hidden_states_and_the_largest_tasks_output(run: PoolingRun, peak: int) -> None:
    assert pooler_peak_bytes(run, 8192, 4096, 2, 3) == peak


def _settings(*flags: str):  # type: ignore[no-untyped-def]
    return EngineCommand.parse(["vllm", "serve", "m", *flags], release="0.19.1").settings()


def test_the_flags_reach_the_settings() -> None:
    settings = _settings("--runner", "pooling", "--convert", "embed")
    assert (settings.runner, settings.convert) == ("pooling", "embed")
    assert (_settings().runner, _settings().convert) == ("auto", "auto")


def test_a_pooling_run_charges_no_sampler_pass() -> None:
    """Qwen3-Embedding-8B on an H100 with 0.19.1: the profile runs the pooler, not the sampler over
    min(seqs, tokens) x 151,665 vocabulary entries; the forward pass is then the peak."""
    count = count_weights(QWEN3_EMBEDDING_8B)
    assert count is not None
    archs = ("Qwen3ForCausalLM",)
    generate = estimate_budget(_settings(), H100, count, 15 * GiB, 2, 32768, V0_19, architectures=archs)
    pooling = estimate_budget(_settings("--runner", "pooling"), H100, count, 15 * GiB, 2, 32768, V0_19,
                              architectures=archs)
    tokens = pooling.max_num_batched_tokens
    assert pooling.activation_peak_bytes == forward_pass_bytes(count, tokens, 2, 1)
    assert pooling.activation_peak_bytes > pooler_peak_bytes(PoolingRun("pooling", "embed"), tokens, 4096, 2, 2)
    assert generate.activation_peak_bytes > pooling.activation_peak_bytes
    assert pooling.kv_cache_bytes - generate.kv_cache_bytes == \
        generate.activation_peak_bytes - pooling.activation_peak_bytes


def test_the_plan_of_a_converted_embedding_model_leaves_out_its_lm_head() -> None:
    """151,665 x 4,096 bf16 parameters of LM head that `--runner pooling` never builds (0.15+)."""
    geometry = geometry_from_config(QWEN3_EMBEDDING_8B)
    rules = ruleset_for("0.19.1")
    memory = MemoryInputs(vllm_version=V0_19)

    def plan(*flags: str):  # type: ignore[no-untyped-def]
        settings = EngineCommand.parse(["vllm", "serve", "m", *flags], release="0.19.1").settings()
        return make_plan(geometry, settings, H100, rules, memory)

    generate, pooling = plan(), plan("--runner", "pooling")
    assert generate.gpu_budget is not None and pooling.gpu_budget is not None
    assert generate.gpu_budget.weights_bytes - pooling.gpu_budget.weights_bytes == 151665 * 4096 * 2
    assert pooling.num_blocks > generate.num_blocks


def test_the_v2_runner_keeps_no_sampler_state_for_a_pooling_model() -> None:
    """0.27+ charges the V2 runner's penalty state (max_num_seqs x vocabulary); a pooling model's runner
    builds no sampler (vLLM 0.27.1, v1/worker/gpu/model_runner.py:351-352)."""
    count = count_weights(QWEN3_EMBEDDING_8B)
    assert count is not None
    version = parse_version("0.32.0")
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"}

    def budget(*flags: str):  # type: ignore[no-untyped-def]
        settings = EngineCommand.parse(["vllm", "serve", "m", *flags], release="0.32.0").settings()
        return estimate_budget(settings, H100, count, 15 * GiB, 2, 32768, version, env,
                               architectures=("Qwen3ForCausalLM",))

    assert budget().runner_state_bytes > 0
    assert budget("--runner", "pooling").runner_state_bytes == 0


@pytest.mark.parametrize(("modules", "pooling"), [
    # Qwen3-Embedding-8B's modules.json
    ([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
      {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}], True),
    ([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}], False),
    ([], False), ({"type": "sentence_transformers.models.Pooling"}, False), (None, False), (["x"], False),
])
def test_a_sentence_transformers_pooling_module_is_what_vllm_finds(modules: object, pooling: bool) -> None:
    assert sentence_transformers_pooling(modules) is pooling


def test_the_plan_of_a_sentence_transformers_checkpoint_is_a_pooling_run(tmp_path: Path) -> None:
    """`vllm serve Qwen/Qwen3-Embedding-8B` without flags: its modules.json makes it a pooling run."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_EMBEDDING_8B))
    argv = ["vllm", "serve", str(tmp_path)]
    plain = plan_command(argv, H100, ruleset_for("0.19.1"), env={}, vllm_version=V0_19)
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    embedding = plan_command(argv, H100, ruleset_for("0.19.1"), env={}, vllm_version=V0_19)
    flagged = plan_command([*argv, "--runner", "pooling"], H100, ruleset_for("0.19.1"), env={}, vllm_version=V0_19)
    assert plain.gpu_budget is not None and embedding.gpu_budget is not None
    assert embedding.gpu_budget.activation_peak_bytes < plain.gpu_budget.activation_peak_bytes
    assert embedding.gpu_budget.weights_bytes == plain.gpu_budget.weights_bytes - 151665 * 4096 * 2
    assert embedding.to_json() == flagged.to_json()


def test_the_lm_head_in_the_weight_files_is_left_out_of_a_converted_model(tmp_path: Path) -> None:
    """Where the weight files are on disk they win over config.json's shapes: a converted model still
    never allocates the `lm_head.weight` they hold. Small shapes: the files, not the figures, matter."""
    config = {**QWEN3_EMBEDDING_8B, "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    body = write_safetensors(tmp_path / "model.safetensors", {
        "model.embed_tokens.weight": ("BF16", [1000, 64], 2), "model.layers.0.mlp.down_proj.weight": ("BF16", [64, 128], 2),
        "lm_head.weight": ("BF16", [1000, 64], 2)})
    source = load_model_source(str(tmp_path))
    assert (source.weights_bytes, source.lm_head_file_bytes) == (body, 1000 * 64 * 2)
    argv = ["vllm", "serve", str(tmp_path)]
    plain = plan_command(argv, H100, ruleset_for("0.19.1"), env={}, vllm_version=V0_19)
    pooling = plan_command([*argv, "--runner", "pooling"], H100, ruleset_for("0.19.1"), env={}, vllm_version=V0_19)
    assert plain.gpu_budget is not None and pooling.gpu_budget is not None
    assert plain.gpu_budget.weights_bytes - pooling.gpu_budget.weights_bytes == 1000 * 64 * 2
