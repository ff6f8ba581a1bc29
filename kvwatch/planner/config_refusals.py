"""What vLLM's validation of its configuration will refuse, from config.json and the flags alone (pure)."""
from __future__ import annotations

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.predicted_refusal import CONFIG_REFUSED, PredictedRefusal


def config_refusals(geometry: ModelGeometry, settings: EngineSettings,
                    allow_long_max_model_len: bool = False) -> list[PredictedRefusal]:
    """What vLLM's validation of its configuration will refuse, decided from config.json and the
    flags alone (config/model.py, config/cache.py, config/scheduler.py of vLLM 0.32)."""
    out: list[PredictedRefusal] = []
    limit = geometry.derived_max_model_len
    given = settings.max_model_len
    if given is not None and limit is not None and given > limit and not allow_long_max_model_len:
        out.append(PredictedRefusal(
            CONFIG_REFUSED,
            f"max model len {given:,} is above the model's maximum ({geometry.derived_max_model_len_key}="
            f"{limit:,} in config.json): vLLM refuses it", FlagChange({"--max-model-len": limit})))
    if settings.max_model_len_auto and given is None and limit is None:
        # config.json names no length: vLLM keeps the -1 it was given (config/model.py
        # _get_and_verify_max_len "If max_model_len is specified, we use it"), then refuses it
        out.append(PredictedRefusal(
            CONFIG_REFUSED,
            "max_model_len must be a positive integer, got int: -1: --max-model-len auto needs a length in "
            "config.json to fit up to, and this one names none", FlagChange({"--max-model-len": geometry.default_max_model_len})))
    heads = geometry.num_attention_heads
    tp = settings.tensor_parallel_size
    if heads and tp > 0 and heads % tp:
        out.append(PredictedRefusal(
            CONFIG_REFUSED,
            f"tensor parallel size {tp} does not divide the model's {heads} attention heads: vLLM refuses it; "
            f"choose a --tensor-parallel-size that divides {heads}", NO_CHANGE))
    if settings.block_size is not None and settings.block_size <= 0:
        out.append(PredictedRefusal(CONFIG_REFUSED, f"block size {settings.block_size} is not a positive number of tokens",
                            FlagChange(remove=("--block-size",))))
    util = settings.gpu_memory_utilization
    if not 0 < util <= 1:   # NaN included
        out.append(PredictedRefusal(
            CONFIG_REFUSED, f"GPU memory utilization {util} is not a fraction in (0, 1]",
            FlagChange({"--gpu-memory-utilization": 0.95}) if util > 1
            else FlagChange(remove=("--gpu-memory-utilization",))))
    batched = settings.max_num_batched_tokens
    max_len = given if given is not None else geometry.default_max_model_len
    if batched is not None and settings.enable_chunked_prefill is False and batched < max_len:
        out.append(PredictedRefusal(
            CONFIG_REFUSED,
            f"max num batched tokens {batched:,} is below max model len {max_len:,} with chunked prefill off: "
            f"vLLM refuses it", FlagChange({"--max-num-batched-tokens": max_len})))
    elif batched is not None and settings.max_num_seqs is not None and batched < settings.max_num_seqs:
        out.append(PredictedRefusal(
            CONFIG_REFUSED,
            f"max num batched tokens {batched:,} is below max num seqs {settings.max_num_seqs:,}: vLLM refuses it",
            FlagChange({"--max-num-batched-tokens": settings.max_num_seqs})))
    return out
