"""Perplexity vs context length: books, the unigram reference."""
