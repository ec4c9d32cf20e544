"""A test hook for ``--logit-processor-module tests.forced_tokens``: the processor
``forced`` makes a request write exactly the token ids in its ``custom_params`` ``ids``,
then ``eos`` (so tests can place tags at chosen token boundaries)."""

import mlx.core as mx


def forced(logits, output_ids, args):
    """Keep only the next forced id's logit (the rest -inf)."""
    ids = args["ids"]
    target = ids[len(output_ids)] if len(output_ids) < len(ids) else args["eos"]
    return mx.where(mx.arange(logits.shape[0]) == target, logits, -mx.inf)


LOGIT_PROCESSORS = {"forced": forced}
