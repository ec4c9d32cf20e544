"""SGLang's native surface: ``POST /generate`` and the server routes (health, metrics, server
info, cache flush, tokenize and detokenize, detokenizer replicas)."""
