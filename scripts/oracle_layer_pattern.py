#!/usr/bin/env python3
"""Load EXAONE config.json variants through the installed vLLM's own get_config, on this CPU.

    python scripts/oracle_layer_pattern.py < cases.json     (a JSON list of config.json dicts)
    python scripts/oracle_layer_pattern.py --traceback < config.json
    python scripts/oracle_layer_pattern.py --tracebacks < cases.json   (a JSON list: a JSON list of tracebacks)

vLLM reads config.json with vllm.transformers_utils.config.get_config, which hands it to transformers'
config class of its model_type (AutoConfig.from_pretrained); no engine is started. The last line
printed is a JSON object: the vLLM and transformers versions, and one answer per case: the layer
types and window the loaded config has, or "error": "<type>: <message>" where loading raises.
With --traceback, one config.json goes through vLLM's own EngineArgs.create_model_config (what
`vllm serve` runs first), and the traceback it raises is printed as Python prints it, with the
site-packages folder written as /venv/lib/python3/site-packages; --tracebacks does the same for each
config.json of a list in one process (one import of vLLM, not one per case) and prints them as a JSON list.
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


def _traceback(config: dict[str, Any]) -> str:
    import site
    import traceback

    from vllm.engine.arg_utils import EngineArgs
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        try:
            EngineArgs(model=folder).create_model_config()
        except Exception:
            text = traceback.format_exc()
        else:
            return ""
    for packages in site.getsitepackages():
        text = text.replace(packages, "/venv/lib/python3/site-packages")
    return text.replace(os.path.abspath(__file__), "/oracle_layer_pattern.py")


def main() -> None:
    logging.disable(logging.CRITICAL)
    if sys.argv[1:] == ["--traceback"]:
        print(_traceback(json.load(sys.stdin)), end="")
        return
    if sys.argv[1:] == ["--tracebacks"]:
        print(json.dumps([_traceback(c) for c in json.load(sys.stdin)]))
        return
    import transformers
    import vllm
    cases = json.load(sys.stdin)
    print(json.dumps({"vllm": vllm.__version__, "transformers": transformers.__version__,
                      "answers": [_load(c) for c in cases]}))


if __name__ == "__main__":
    main()
