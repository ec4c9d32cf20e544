"""The tokenizer process: HTTP front, chat templates, tokenization, per-request state."""
