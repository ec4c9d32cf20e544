"""Per-row output control inside the MLX graph (DESIGN.md §10).

One launch turns the model's logits [B, V] into tokens in this order (`pipeline.process`):

1. logit edit rows (`edits`): one additive float32 row per request that needs one: its
   logit_bias, its grammar's mask (-inf on disallowed tokens) and min_tokens (-inf on EOS
   and stop ids until the request has that many tokens); rows without edits pay nothing;
2. penalties (`penalties`): repetition (prompt + generated), frequency and presence
   (generated only), from per-row token counts kept on the device and advanced in the
   graph with the sampled tokens, so penalized rows keep chaining;
3. custom logit processors (`custom`), operator code behind a flag, for the rows naming one;
4. logprobs (`logprobs`): a log-softmax of these logits for the rows that ask, with the
   chosen token's value, a top-k and requested ids, lazy until finalize;
5. sampling (`sampling`): temperature, top-k, top-p, min-p and seeded Gumbel noise drawn for
   all sampled rows in one vmapped op; greedy rows take the argmax and draw nothing.
"""
