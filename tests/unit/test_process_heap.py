"""A child's start-up objects are frozen out of the cyclic collector once it reports ready
(`protocol.process.freeze_startup_heap`, called by `Handshake.ready`)."""

from __future__ import annotations

import gc

import zmq

from protocol import endpoints
from protocol.codec import control as decoder
from protocol.enums import Role
from protocol.messages import Ready
from protocol.process import Handshake


def test_ready_freezes_the_heap_of_start_up_and_reports(tmp_path):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(endpoints.control(tmp_path))
    start_up = [[i] for i in range(1000)]  # objects alive at ready, like a model's
    gc.unfreeze()
    try:
        hs = Handshake(ctx, str(tmp_path), Role.SCHEDULER)
        assert gc.get_freeze_count() == 0
        hs.ready("info")
        frozen = gc.get_freeze_count()
        assert frozen >= len(start_up)
        later = [[i] for i in range(10)]
        assert gc.get_freeze_count() == frozen and later  # later objects are not frozen
        hs.ready("again")  # once only
        assert gc.get_freeze_count() == frozen
        assert pull.poll(5000)
        msgs = [decoder.decode(pull.recv())]
        while pull.poll(200):
            msgs.append(decoder.decode(pull.recv()))
        assert [m for m in msgs if isinstance(m, Ready)] == [Ready(Role.SCHEDULER, 0, "info")]
        hs.close()
    finally:
        gc.unfreeze()
        ctx.destroy(linger=0)
