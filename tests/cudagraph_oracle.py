"""Run one vLLM release's own CUDA graph sizing on stand-in configs and print what it records.

    PYTHONPATH=<root>/<release> python tests/cudagraph_oracle.py '[[major, minor, max_num_seqs, max_num_batched_tokens], ...]'

Imports the release's vllm.config (pure Python: it imports on a CPU) and calls its own
VllmConfig._set_cudagraph_sizes, with _split_cudagraph_capture_sizes and the helpers it reaches on a
VllmConfig where the release has them, on an object holding only what they read: the default
CompilationConfig at the default optimization level's FULL_AND_PIECEWISE mode, the scheduler's two
limits, no speculative decoding, "balanced" performance mode. The current platform answers
is_device_capability_family for the card asked about. Prints one JSON list, the recorded
cudagraph_capture_sizes per case. Run by tests/test_cudagraph_sizes.py; imports nothing of kvwatch.
"""
from __future__ import annotations

import json
import sys
import types


def main(cases: list[list[int]]) -> list[list[int]]:
    import vllm.platforms as platforms
    from vllm.config import VllmConfig
    from vllm.config.compilation import CompilationConfig, CUDAGraphMode

    borrowed = ("_set_cudagraph_sizes", "_split_cudagraph_capture_sizes", "get_decode_cudagraph_query_lens",
                "get_draft_decode_cudagraph_request_sizes", "uniform_decode_query_len", "num_speculative_tokens")
    config_type = type("Config", (), {name: getattr(VllmConfig, name) for name in borrowed if hasattr(VllmConfig, name)})
    out = []
    for major, _minor, max_num_seqs, max_num_batched_tokens in cases:
        platforms.current_platform = types.SimpleNamespace(
            is_device_capability_family=lambda capability, major=major: capability // 10 == major)
        config = config_type()
        config.model_config = types.SimpleNamespace(enforce_eager=False)
        config.compilation_config = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)
        config.scheduler_config = types.SimpleNamespace(max_num_seqs=max_num_seqs,
                                                        max_num_batched_tokens=max_num_batched_tokens)
        config.speculative_config = None
        config.diffusion_config = None
        config.performance_mode = "balanced"
        config._set_cudagraph_sizes()
        out.append(list(config.compilation_config.cudagraph_capture_sizes))
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
