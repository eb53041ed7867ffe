"""The models the methods drive: the interface (lm), EVALM, Hugging Face and T5 backends, loading, decoding."""
