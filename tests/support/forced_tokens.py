"""A test hook for ``--logit-processor-module tests.support.forced_tokens``: the processor
``forced`` makes a request write exactly the token ids in its ``custom_params`` ``ids``,
then ``eos`` (so tests can place tags at chosen token boundaries); ``ranked`` makes it prefer
them, so that under a grammar it writes the nearest text the grammar allows."""

import mlx.core as mx
import numpy as np


def forced(logits, output_ids, args):
    """Keep only the next forced id's logit (the rest -inf)."""
    ids = args["ids"]
    target = ids[len(output_ids)] if len(output_ids) < len(ids) else args["eos"]
    return mx.where(mx.arange(logits.shape[0]) == target, logits, -mx.inf)


def ranked(logits, output_ids, args):
    """Rank instead of force: the next id of ``ids`` (then ``eos``) first, then the
    ``fallback`` ids in their order, then the model's own choice. A token a grammar masked
    (-inf) stays masked, so under a grammar the request writes the best-ranked token the
    grammar allows (tests make a model "want" text that the grammar refuses)."""
    ids = args["ids"]
    order = [ids[len(output_ids)] if len(output_ids) < len(ids) else args["eos"]] + list(args.get("fallback", []))
    bonus = np.zeros(logits.shape[0], dtype=np.float32)
    for rank, token in reversed(list(enumerate(order))):
        bonus[token] = 1e4 * (len(order) - rank)
    return logits + mx.array(bonus)


LOGIT_PROCESSORS = {"forced": forced, "ranked": ranked}
