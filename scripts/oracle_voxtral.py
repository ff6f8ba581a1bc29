#!/usr/bin/env python3
"""Run one vLLM release's own Mistral-format config parser on Voxtral params.json files, on this CPU.

    python scripts/oracle_voxtral.py RELEASE_TREE < cases.json > answers.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...), one process per release so that releases'
modules never mix. vllm/transformers_utils/configs/mistral.py is the release's own file, loaded as
scripts/oracle_kv_groups.py loads the spec modules (every other vllm module a stand-in, `init_logger`
the standard logger; transformers is the installed one): `adapt_config_dict` is what vLLM's
MistralConfigParser runs on a params.json (transformers_utils/config.py), with the defaults it reads
from an HF config.json beside it (none here).

Each case is one params.json. The answer: the architecture vLLM derives, the audio config's fields
that decide which encoder VoxtralEncoderModel builds and how (`is_causal`, `block_pool_size`,
`sliding_window`, its heads and head size, layers) and the text config's cache figures, or
"error: <type>: <message>".
"""
from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_kv_groups as shared  # noqa: E402

PARSER = "vllm.transformers_utils.configs.mistral"


def _answer(mistral: Any, params: dict[str, Any]) -> Any:
    try:
        config = mistral.adapt_config_dict(json.loads(json.dumps(params)), defaults={})
    except (ValueError, AssertionError, KeyError, TypeError) as exc:
        return f"error: {type(exc).__name__}: {exc}"
    audio, text = config.audio_config, config.text_config
    return {
        "architectures": list(config.architectures), "model_type": config.model_type,
        "audio": {"is_causal": bool(getattr(audio, "is_causal", False)), "block_pool_size": audio.block_pool_size,
                  "sliding_window": getattr(audio, "sliding_window", None), "layers": audio.encoder_layers,
                  "heads": audio.encoder_attention_heads, "head_dim": audio.encoder_head_dim,
                  "d_model": audio.d_model},
        "text": {"architectures": list(text.architectures), "layers": text.num_hidden_layers,
                 "kv_heads": text.num_key_value_heads, "head_dim": text.head_dim,
                 "sliding_window": getattr(text, "sliding_window", None),
                 "layer_types": sorted(set(getattr(text, "layer_types", None) or ())),
                 "max_position_embeddings": text.max_position_embeddings},
    }


def main() -> int:
    tree = Path(sys.argv[1])
    shared.REAL.add(PARSER)
    sys.meta_path.insert(0, shared.ReleaseFinder(tree))
    logging.disable(logging.WARNING)
    mistral = importlib.import_module(PARSER)
    json.dump([_answer(mistral, case) for case in json.load(sys.stdin)], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
