#!/usr/bin/env python3
"""Load EXAONE config.json variants through the installed vLLM's own get_config, on this CPU.

    python scripts/oracle_layer_pattern.py < cases.json     (a JSON list of config.json dicts)

vLLM reads config.json with vllm.transformers_utils.config.get_config, which hands it to transformers'
config class of its model_type (AutoConfig.from_pretrained); no engine is started. The last line
printed is a JSON object: the vLLM and transformers versions, and one answer per case: the layer
types and window the loaded config has, or "error": "<type>: <message>" where loading raises.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from typing import Any


def _load(config: dict[str, Any]) -> dict[str, Any]:
    from vllm.transformers_utils.config import get_config
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        try:
            loaded = get_config(folder, trust_remote_code=False)
        except Exception as e:   # what the engine's log ends with
            return {"error": f"{type(e).__name__}: {e}"}
    return {"layer_types": list(loaded.layer_types), "sliding_window": loaded.sliding_window}


def main() -> None:
    logging.disable(logging.CRITICAL)
    import transformers
    import vllm
    cases = json.load(sys.stdin)
    print(json.dumps({"vllm": vllm.__version__, "transformers": transformers.__version__,
                      "answers": [_load(c) for c in cases]}))


if __name__ == "__main__":
    main()
