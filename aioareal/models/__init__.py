"""Models and tokenizers: hub/local loading, the offline character tokenizer, named shapes."""
from .load_policy import eos_token_ids, load_model, load_tokenizer, random_model, resolve_dtype

__all__ = ["eos_token_ids", "load_model", "load_tokenizer", "random_model", "resolve_dtype"]
