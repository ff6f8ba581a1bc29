"""Plan accuracy on the real vLLM CPU engine: kvwatch's plan vs a fudge-factor sizing rule.

Every case of the architecture corpus (tests/fixtures/models: shrunk public config.json files of
Gemma 2/3, gpt-oss, Llama 3/4, Mistral, Phi-3, Qwen3 dense/MoE/Next, Granite-4.0-H, DeepSeek-V3, and
issue 26's Gemma 4, Gemma 3n, Mamba-Codestral, Falcon-Mamba, LFM2, Cohere2, OLMo 3, EXAONE 4, SmolLM3,
GLM-4, Phi-3 LongRoPE, Nemotron-H, Jamba, Falcon-H1; the refused ones are listed with the engine's error)
with its default block size, an explicit one and the extra flags tests/record_kv_truth.py lists
(fp8, --disable-hybrid-kv-cache-manager, --max-model-len auto). Side by side per case: the blocks and KV tokens the engine reports
(its `num_gpu_blocks` and its "KV cache size: N tokens" line), kvwatch's plan, and the rule small
sizing tools use (KV bytes/token = 2 x layers x kv_heads x head_dim x dtype bytes, every layer
full attention; memory = weights + KV x 1.15).

Run:  .venv/bin/python bench/bench_plan_accuracy.py            (starts ~30 engines, 2 at a time: ~15-25 min)
      .venv/bin/python bench/bench_plan_accuracy.py --recorded (the engine figures recorded in kv_truth.json)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fixtures.models import corpus  # noqa: E402
from test_plan_corpus import REFUSED, REFUSED_WITH_FLAGS, SIZED, TRUTH, plan_case  # noqa: E402

GiB = 2**30


def fudge(config: dict, flags: list[str], block_size: int, kv_memory: int, max_model_len: int) -> tuple[int, int]:
    """Blocks and tokens a weights + KV x 1.15 rule predicts: every layer full attention. A model
    with no attention heads (Mamba) has no KV per token for the rule: it predicts nothing (0)."""
    cfg = config.get("text_config", config)
    if "num_attention_heads" not in cfg:
        return 0, 0
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if cfg.get("kv_lora_rank"):
        head_dim = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) // 2   # 2 x this = the latent
    kv_heads = 1 if cfg.get("kv_lora_rank") else cfg.get("num_key_value_heads", heads)
    dtype_bytes = 4 if "float32" in flags else 1 if "fp8" in flags else 2
    per_token = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes
    blocks = int(kv_memory / (per_token * 1.15)) // block_size
    return blocks, blocks * block_size


def engine_cases(recorded: bool) -> list[dict]:
    if recorded:
        return SIZED
    from kv_probe import probe
    with tempfile.TemporaryDirectory() as tmp:
        def run(index: int) -> dict:
            case = SIZED[index]
            live = probe(corpus.CORPUS[case["model"]]["config"], case["flags"], Path(tmp) / str(index))
            return {**live, "model": case["model"], "flags": case["flags"]}
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(run, range(len(SIZED))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recorded", action="store_true", help="use tests/fixtures/models/kv_truth.json")
    args = parser.parse_args()
    cases = engine_cases(args.recorded)
    source = "recorded (kv_truth.json)" if args.recorded else "live engines"
    print(f"engine figures: {source}; KV memory {TRUTH['kv_space_gib']} GiB (VLLM_CPU_KVCACHE_SPACE)")
    print(f"{'case':<44}{'block':>6}{'engine blk':>11}{'kvwatch':>9}{'fudge':>9}"
          f"{'engine tok':>13}{'kvwatch':>12}{'fudge':>12}")
    worst = {"kvwatch_blocks": 0, "kvwatch_tokens": 0, "fudge_blocks": 0, "fudge_tokens": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(cases):
            name = f"{case['model']} {' '.join(case['flags'])}".strip()
            if case.get("kv_cache_tokens") is None:
                print(f"{name:<44} engine did not size its cache: {case.get('error')}")
                continue
            plan = plan_case(case["model"], case["flags"], Path(tmp) / str(i))
            f_blocks, f_tokens = fudge(corpus.CORPUS[case["model"]]["config"], case["flags"], case["block_size"],
                                       TRUTH["kv_space_gib"] * GiB, case["max_model_len"])
            worst["kvwatch_blocks"] = max(worst["kvwatch_blocks"], abs(plan.num_blocks - case["num_blocks"]))
            worst["kvwatch_tokens"] = max(worst["kvwatch_tokens"], abs(plan.kv_cache_tokens - case["kv_cache_tokens"]))
            worst["fudge_blocks"] = max(worst["fudge_blocks"], abs(f_blocks - case["num_blocks"]))
            worst["fudge_tokens"] = max(worst["fudge_tokens"], abs(f_tokens - case["kv_cache_tokens"]))
            print(f"{name:<44}{case['block_size']:>6}{case['num_blocks']:>11}{plan.num_blocks:>9}{f_blocks:>9}"
                  f"{case['kv_cache_tokens']:>13,}{plan.kv_cache_tokens:>12,}{f_tokens:>12,}", flush=True)
    print(f"worst |planned - actual|: kvwatch {worst['kvwatch_blocks']} blocks, {worst['kvwatch_tokens']} tokens; "
          f"fudge rule {worst['fudge_blocks']} blocks, {worst['fudge_tokens']:,} tokens (goal: kvwatch 0 and 0)")
    refused(args.recorded)


def refused(recorded: bool) -> None:
    """The recorded cases the engine refused (or sized and then failed): its sentence beside the
    plan's verdict. The fudge rule predicts no refusal at all."""
    if not recorded:
        return
    failed = [c for c in TRUTH["cases"] if c.get("num_blocks") is None]
    predicted = 0
    print(f"\nrefused by the engine ({len(failed)} cases): kvwatch plan exits 3 with vLLM's sentence?")
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(failed):
            name = f"{case['model']} {' '.join(case['flags'])}".strip()
            try:
                plan = plan_case(case["model"], case["flags"], Path(tmp) / str(i))
            except Exception as exc:   # a config kvwatch itself refuses: say so, do not stop the table
                print(f"  {name:<44} kvwatch: {exc}")
                continue
            sentences = case.get("errors") or [case.get("error") or ""]
            # vLLM's sentence for the case, as the corpus test names it (none: not a refusal of vLLM's)
            expected = (REFUSED.get(case["model"]) if not case["flags"] else None) or \
                REFUSED_WITH_FLAGS.get((case["model"], tuple(case["flags"])))
            if expected is None and case.get("kv_cache_tokens") is not None:
                expected = next((w.message.split(": vLLM")[0] for w in plan.warnings if w.certain), None)
            if expected is None:
                print(f"  {name:<44} not vLLM's refusal (this machine's): {sentences[-1][:80]}")
                continue
            hit = plan.will_fail and any(expected in w.message for w in plan.warnings if w.certain) \
                and any(expected in s for s in sentences)
            predicted += hit
            print(f"  {name:<44} {'predicted' if hit else 'NOT predicted'}: {sentences[-1][:80]}")
    print(f"refusals predicted: {predicted}")


if __name__ == "__main__":
    main()
