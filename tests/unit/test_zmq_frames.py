"""Frame limits (issue 14, hostile input): the request body limit stays under the ZeroMQ
frame limit (`protocol.sockets.MAX_FRAME_BYTES`). Malformed frames sent to a running server:
tests/e2e/test_zmq_frames.py."""

from __future__ import annotations

import pytest

from protocol.sockets import MAX_FRAME_BYTES


def test_request_body_limit_stays_under_the_frame_limit():
    """A request must fit in a frame: launch refuses a body limit above a quarter of it."""
    from launcher.args import parse_args

    assert (
        parse_args(["--max-request-body-bytes", str(MAX_FRAME_BYTES // 4)]).max_request_body_bytes
        == MAX_FRAME_BYTES // 4
    )
    with pytest.raises(SystemExit):
        parse_args(["--max-request-body-bytes", str(MAX_FRAME_BYTES // 4 + 1)])
