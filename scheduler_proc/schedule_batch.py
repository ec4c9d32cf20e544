"""`ScheduleBatch`: the scheduler's view of one launch, and its wire form `ForwardBatch`."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch
from scheduler_proc.req import Req


@dataclass
class ScheduleBatch:
    """One launch. reqs: the rows in worker row order. chunks[i]: the (start, end) slice of
    reqs[i]'s prompt that row computes, or None for a decode row (DECODE and TARGET_VERIFY
    batches have no chunks). launch_id: set when sent. drafts[i]: TARGET_VERIFY only, the
    draft tokens of reqs[i] (each holds a KV slot for its last token and each draft token).
    draft_cap: the draft-length cap speculative decoding chose for the batch (0: off; a
    DECODE with a cap found no draft), for the speed policy's measurements
    (`scheduler_proc.spec.policy`)."""

    mode: ForwardMode
    reqs: list[Req]
    chunks: list[tuple[int, int] | None] = field(default_factory=list)
    launch_id: int = -1
    drafts: list[list[int]] = field(default_factory=list)
    draft_cap: int = 0

    def is_final(self, i: int) -> bool:
        """True when row i yields a token (a decode row, or a chunk that ends its prompt)."""
        if not self.chunks or self.chunks[i] is None:
            return True
        return self.chunks[i][1] == len(self.reqs[i].fill_ids)

    def to_forward_batch(self) -> ForwardBatch:
        """The wire form: prompt chunks for extend rows, sampling params, the cached
        prefix's slots (and its ids for penalized rows) and the count of already generated
        tokens only with a request's first chunk (sent once), nothing but rids for decode
        rows; the recurrent-state snapshots to save after a chunk and to restore with a first
        chunk; and the token masks of the rows that sample under a grammar or a forced
        reasoning-budget token this launch; TARGET_VERIFY: rids, those masks and the drafts."""
        rids = [r.rid for r in self.reqs]
        masks = [(i, r.next_mask()) for i, r in enumerate(self.reqs) if self.is_final(i)]
        g_rows = [i for i, m in masks if m is not None]
        g_masks = [m for _, m in masks if m is not None]
        if self.mode == ForwardMode.DECODE:
            return ForwardBatch(rids, grammar_rows=g_rows, grammar_masks=g_masks)
        if self.mode == ForwardMode.TARGET_VERIFY:
            return ForwardBatch(rids, grammar_rows=g_rows, grammar_masks=g_masks, draft_ids=self.drafts)
        input_ids, sampling, final, prefix, prefix_ids, generated = [], [], [], [], [], []
        save_at, save_slots, restores = [], [], []
        for i, (req, chunk) in enumerate(zip(self.reqs, self.chunks)):
            first = chunk is not None and chunk[0] == req.kv.prefix_len
            saves = [(p, s) for p, s in req.kv.snapshots if chunk is not None and chunk[0] < p <= chunk[1]]
            save_at.append([p for p, _ in saves])
            save_slots.append([s for _, s in saves])
            restores.append(req.kv.prefix_state if first else 0)
            input_ids.append([] if chunk is None else req.fill_ids[chunk[0] : chunk[1]])
            sampling.append(req.msg.sampling if first else None)
            prefix.append(req.kv.prefix_slots if first else [])
            penalized = first and req.msg.sampling.penalized
            prefix_ids.append(req.fill_ids[: req.kv.prefix_len] if penalized else [])
            generated.append(len(req.output_ids) if first else 0)
            final.append(self.is_final(i))
        return ForwardBatch(
            rids,
            input_ids,
            sampling,
            final,
            prefix if any(prefix) else [],
            prefix_ids if any(prefix_ids) else [],
            generated if any(generated) else [],
            g_rows,
            g_masks,
            save_at if any(save_at) else [],
            save_slots if any(save_slots) else [],
            restores if any(restores) else [],
        )
