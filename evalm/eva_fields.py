"""The `evalm` settings of a `transformers` config that shape EVA (docs/model.md, "Configuration").

One tuple, read by the attention (evalm/hf_attention.py), the Llama config (evalm/hf_llama.py) and the
converter (train/convert.py). It imports nothing, so `evalm convert --help` and its refusals still load
no torch.
"""

EVA_FIELDS = ("window_size", "chunk_size", "overlap_window", "use_t5_bias", "exclude_window_chunks", "adaptive_proj",
              "sink_tokens")
