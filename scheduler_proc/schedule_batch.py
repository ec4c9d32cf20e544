"""`ScheduleBatch`: the scheduler's view of one launch, and its wire form `ForwardBatch`."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch
from scheduler_proc.req import Req


@dataclass
class ScheduleBatch:
    """mode: EXTEND (prefill of new reqs) or DECODE (one token for each running req); reqs
    in worker row order; launch_id: set when sent."""

    mode: ForwardMode
    reqs: list[Req]
    launch_id: int = -1

    def to_forward_batch(self) -> ForwardBatch:
        """The wire form: prompts and sampling params only for EXTEND (sent once)."""
        rids = [r.rid for r in self.reqs]
        if self.mode == ForwardMode.EXTEND:
            return ForwardBatch(rids, [r.input_ids for r in self.reqs], [r.msg.sampling for r in self.reqs])
        return ForwardBatch(rids)
