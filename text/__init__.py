"""Where text comes from and how it becomes tokens, on the ground floor beside the model: what both
training and evaluation read that is not the model.

- `data_source`: data where researchers keep it (files, `save_to_disk` folders, the offline
  `datasets` cache), read through Hugging Face `datasets` with the hub switched off;
- `synthetic`: the synthetic in-context family's rows (a fresh rule per episode), pure Python;
- `tokenizer`: the tokenizers a model reads with (bytes, `tokenizer.json`, SentencePiece).
"""
