"""Record what vLLM's own layer classes, spec classes and KV cache planning give for the families
whose layers build specs of their own (Inkling, ...), per release, from the unpacked wheels.

    KVWATCH_VLLM_SRC=/path/to/src .venv/bin/python tests/record_own_spec_oracle.py

Runs scripts/oracle_own_specs.py in a process per release (SRC/<release>/vllm/...) on CASES and
writes tests/fixtures/models/own_spec_oracle.json, which tests/test_own_spec_oracle.py compares
kvwatch's plans with (and, where the sources are present, re-runs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.models.own_spec_configs import OWN_SPEC_CONFIGS, text_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "models" / "own_spec_oracle.json"
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
MEMORY = 40 << 30          # a 40 GiB KV cache budget
MAX_MODEL_LEN, BATCHED = 4096, 2048
IN_FLIGHT = 2 * BATCHED    # async scheduling on a GPU keeps two batches in flight (planner/scheduler.py)
FAMILIES = {"inkling_small": "inkling", "inkling": "inkling"}
# (tensor parallel size, --block-size, --kv-cache-dtype, the model dtype): TP 16 is beyond the rings'
# 8 KV heads; the rings hold bfloat16 only
SETTINGS = ((1, 16, "auto", "bfloat16"), (2, 16, "auto", "bfloat16"), (8, 16, "auto", "bfloat16"),
            (1, 64, "auto", "bfloat16"), (1, 16, "fp8", "bfloat16"), (16, 16, "auto", "bfloat16"),
            (1, 16, "auto", "float16"))


def _case(name: str, config: dict[str, Any], tp: int, block: int, kv_dtype: str, dtype: str,
          disable_hybrid: bool = False) -> dict[str, Any]:
    return {"name": name, "family": FAMILIES[name.split("+")[0]], "config": config, "tp": tp, "block_size": block,
            "kv_cache_dtype": kv_dtype, "dtype": dtype, "disable_hybrid": disable_hybrid, "memory": MEMORY,
            "max_model_len": MAX_MODEL_LEN, "max_num_batched_tokens": BATCHED, "max_in_flight_tokens": IN_FLIGHT}


def cases() -> list[dict[str, Any]]:
    """SETTINGS on each real config; --disable-hybrid-kv-cache-manager on each (vLLM refuses it: the
    rings' window beside the sliding layers'); and, derived from Inkling-Small with no local layer
    ("+no_local": local_layer_ids emptied, nothing else changed), the rings promoted to full attention."""
    out = [_case(name, text_config(name), *settings) for name in OWN_SPEC_CONFIGS for settings in SETTINGS]
    out += [_case(name, text_config(name), 1, 16, "auto", "bfloat16", True) for name in OWN_SPEC_CONFIGS]
    no_local = {**text_config("inkling_small"), "local_layer_ids": []}
    out += [_case("inkling_small+no_local", no_local, 1, 16, "auto", "bfloat16", disable)
            for disable in (False, True)]
    return out


def run_oracle(tree: Path, batch: list[dict[str, Any]]) -> list[Any]:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "oracle_own_specs.py"), str(tree)],
                          input=json.dumps(batch), capture_output=True, text=True, check=True, timeout=600)
    answers: list[Any] = json.loads(done.stdout)
    return answers


def label(case: dict[str, Any]) -> str:
    hybrid = " --disable-hybrid-kv-cache-manager" if case["disable_hybrid"] else ""
    return f"{case['name']} tp{case['tp']} block{case['block_size']} {case['kv_cache_dtype']} {case['dtype']}{hybrid}"


def main() -> int:
    src = Path(os.environ.get("KVWATCH_VLLM_SRC", ""))
    batch = cases()
    data = {"memory": MEMORY, "releases": {}}
    for release in RELEASES:
        answers = run_oracle(src / release, batch)
        data["releases"][release] = [{"case": label(c), "vllm": a} for c, a in zip(batch, answers, strict=True)]
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, prefix=".own_spec_oracle.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, OUT)
    for release, rows in data["releases"].items():
        for row in rows:
            answer = row["vllm"]
            print(release, row["case"], answer if isinstance(answer, str) else
                  (answer["bytes_per_block"], answer["num_blocks"], answer["tokens"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
