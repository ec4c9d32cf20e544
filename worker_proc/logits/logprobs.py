"""Lazy logprob arrays: computed in the graph beside the tokens, read at finalize.

Logprobs are a log-softmax of the logits after logit edits and penalties, before
temperature and top-k/top-p/min-p (README "Logprobs"); the same for prompt positions, whose
logits get the request's logit_bias only (grammar, min_tokens and penalties depend on the
output so far). Masked tokens have -inf; the HTTP process clamps it for JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from protocol.messages import TokenLogprobs


@dataclass
class LazyLogprobs:
    """Logprobs of N scored positions, lazy until `to_wire`.

    targets int32 [N]: the token scored at each position; chosen float32 [N]: its logprob;
    top_ids int32 [N, K] / top_logprobs float32 [N, K] (K = max of ks; None when 0);
    ids_logprobs float32 [N, M] (M = max len of id_lists; None when 0). ks[n] / id_lists[n]:
    what position n's request asked for.
    """

    targets: mx.array
    chosen: mx.array
    top_ids: mx.array | None
    top_logprobs: mx.array | None
    ids_logprobs: mx.array | None
    ks: list[int]
    id_lists: list[list[int]]

    def arrays(self) -> list[mx.array]:
        """The lazy arrays, for `mx.async_eval` with the launch's tokens."""
        return [
            a for a in (self.targets, self.chosen, self.top_ids, self.top_logprobs, self.ids_logprobs) if a is not None
        ]

    def rows(self, groups: list[list[int]]) -> list[TokenLogprobs]:
        """Evaluate (blocks) and split into one `TokenLogprobs` per group of positions
        (groups[g]: position indices, in order)."""
        targets, chosen = self.targets.tolist(), self.chosen.tolist()
        top_ids = self.top_ids.tolist() if self.top_ids is not None else None
        top_lp = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        ids_lp = self.ids_logprobs.tolist() if self.ids_logprobs is not None else None
        out = []
        for g in groups:
            out.append(
                TokenLogprobs(
                    [targets[n] for n in g],
                    [chosen[n] for n in g],
                    [top_ids[n][: self.ks[n]] for n in g] if top_ids is not None and any(self.ks[n] for n in g) else [],
                    [top_lp[n][: self.ks[n]] for n in g] if top_lp is not None and any(self.ks[n] for n in g) else [],
                    [ids_lp[n][: len(self.id_lists[n])] for n in g]
                    if ids_lp is not None and any(self.id_lists[n] for n in g)
                    else [],
                )
            )
        return out


def score(logits: mx.array, targets: mx.array, ks: list[int], id_lists: list[list[int]]) -> LazyLogprobs:
    """Logprobs of `targets` int32 [N] under logits float32 [N, V], with each position's top
    ks[n] tokens (most likely first) and the ids id_lists[n] (lazy)."""
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, targets[:, None].astype(mx.int32), axis=-1)[:, 0]
    top_ids = top_lp = ids_lp = None
    k = max(ks, default=0)
    if k > 0:
        part = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k] if k < lp.shape[-1] else mx.argsort(-lp, axis=-1)
        part_lp = mx.take_along_axis(lp, part, axis=-1)
        order = mx.argsort(-part_lp, axis=-1)
        top_ids = mx.take_along_axis(part, order, axis=-1).astype(mx.int32)
        top_lp = mx.take_along_axis(part_lp, order, axis=-1)
    m = max((len(ids) for ids in id_lists), default=0)
    if m > 0:
        padded = mx.array([ids + [0] * (m - len(ids)) for ids in id_lists], dtype=mx.int32)
        ids_lp = mx.take_along_axis(lp, padded, axis=-1)
    return LazyLogprobs(targets, chosen, top_ids, top_lp, ids_lp, list(ks), [list(x) for x in id_lists])
