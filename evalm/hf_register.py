"""`evalm.register_with_transformers()`: EVA and evalm's model classes made known to `transformers`.

Explicit, never an import side effect (`import evalm` loads neither torch nor transformers). After
the call, `attn_implementation="eva"` names EVA's attention function (evalm/hf_attention.py), and
`AutoConfig` / `AutoModelForCausalLM` load folders of model_type "evalm" (an `evalm export --hf`
folder: evalm/hf_evalm.py) and "eva_llama" (a Llama with EVA: evalm/hf_llama.py) from evalm's own
classes, with no remote code.
"""

from __future__ import annotations


def register_with_transformers() -> None:
    """Register EVA's attention function and evalm's model classes with `transformers` (idempotent)."""
    from evalm.config_toolkit import transformers_module
    from evalm.hf_attention import register_attention
    from evalm.hf_evalm import EvalmConfig, EvalmForCausalLM
    from evalm.hf_llama import EvaLlamaConfig, EvaLlamaForCausalLM

    tf = transformers_module()
    register_attention()
    for config, model in ((EvalmConfig, EvalmForCausalLM), (EvaLlamaConfig, EvaLlamaForCausalLM)):
        tf.AutoConfig.register(config.model_type, config, exist_ok=True)
        tf.AutoModelForCausalLM.register(config, model, exist_ok=True)
