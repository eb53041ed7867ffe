"""icl_eval package."""
