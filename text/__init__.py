"""Text code shared by the HTTP process and the detokenizer replicas: loading the served
model's tokenizer (`hf_tokenizer`), one token's text and bytes (`token_pieces`), UTF-8-safe
incremental decoding (`incremental`) and logprob columns rendered as entries (`logprob_render`).
It imports neither process: both import it."""
