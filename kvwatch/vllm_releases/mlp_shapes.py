"""The model families whose vLLM model file builds a two-matrix MLP (an up projection, the
activation, a down projection; no gate), and the width each reads from its config. Every other
decoder vLLM serves builds a gated MLP (gate and up merged, then down: three matrices). Read from
vLLM 0.22.1's model files (the same classes from 0.8.5.post1 on); each row names its class.

A row's width: the config key vLLM reads, then the multiple of the hidden size it falls back to
(0: no fall-back, the key is required). Left out: jais (gated when its activation is swiglu,
jais.py:150-175) and nemotron_h (a hybrid whose layers are Mamba, attention or MLP, which
count_weights does not count per layer)."""
from __future__ import annotations

from typing import NamedTuple


class NonGatedMlp(NamedTuple):
    width_key: str        # the config key of the MLP's inner width ("" where vLLM fixes it)
    hidden_multiple: int  # the inner width as a multiple of hidden_size where the key is absent
    source: str           # vLLM 0.22.1, the class building the two matrices


NON_GATED_MLPS: dict[str, NonGatedMlp] = {
    # model_type: width key, fall-back, where vLLM builds it
    "phi": NonGatedMlp("n_inner", 4, "vllm/model_executor/models/phi.py:140-163 PhiMLP fc1/fc2"),
    "gpt_neox": NonGatedMlp("intermediate_size", 0, "vllm/model_executor/models/gpt_neox.py:121-140 GPTNeoXMLP"),
    "starcoder2": NonGatedMlp("intermediate_size", 0, "vllm/model_executor/models/starcoder2.py:142-163 Starcoder2MLP"),
    "nemotron": NonGatedMlp("intermediate_size", 0, "vllm/model_executor/models/nemotron.py:111-135 NemotronMLP"),
    "persimmon": NonGatedMlp("intermediate_size", 0, "vllm/model_executor/models/persimmon.py:63-82 PersimmonMLP"),
    "falcon": NonGatedMlp("", 4, "vllm/model_executor/models/falcon.py:225-255 FalconMLP (4 x hidden)"),
    "opt": NonGatedMlp("ffn_dim", 0, "vllm/model_executor/models/opt.py:151-165 fc1/fc2"),
    "gpt2": NonGatedMlp("n_inner", 4, "vllm/model_executor/models/gpt2.py:115-138 GPT2MLP, width :158"),
    "gpt_bigcode": NonGatedMlp("n_inner", 4, "vllm/model_executor/models/gpt_bigcode.py:130-153 GPTBigMLP, width :173"),
    "gptj": NonGatedMlp("n_inner", 4, "vllm/model_executor/models/gpt_j.py:129-150 GPTJMLP, width :169"),
    "bloom": NonGatedMlp("", 4, "vllm/model_executor/models/bloom.py:152-173 BloomMLP (4 x hidden)"),
    "mpt": NonGatedMlp("", 0, "vllm/model_executor/models/mpt.py:152-177 MPTMLP (expansion_ratio x d_model)"),
    "apertus": NonGatedMlp("intermediate_size", 0, "vllm/model_executor/models/apertus.py:81-107 ApertusMLP (xIELU)"),
    "arcee": NonGatedMlp("intermediate_size", 0, "vllm/model_executor/models/arcee.py:52-84 ArceeMLP (ReLU^2)"),
    "jais2": NonGatedMlp("intermediate_size", 0, "vllm/model_executor/models/jais2.py:72-96 Jais2MLP"),
}


def non_gated_mlp(model_type: object) -> NonGatedMlp | None:
    """The two-matrix MLP row of a config's model_type, None for a gated one."""
    return NON_GATED_MLPS.get(model_type) if isinstance(model_type, str) else None
