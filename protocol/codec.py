"""Encoders and decoders, one decoder per channel (DESIGN.md §3).

Each decoder accepts exactly the messages of its channel's base class and raises
`msgspec.ValidationError` / `msgspec.DecodeError` on anything else.
"""

from __future__ import annotations

from typing import Union

import msgspec

from protocol import messages as m


def _channel_union(base: type) -> object:
    """Union of every direct subclass of `base` defined in `protocol.messages`."""
    return Union[tuple(base.__subclasses__())]  # noqa: UP007 (msgspec needs typing.Union)


encoder = msgspec.msgpack.Encoder()
"""Shared encoder: `encoder.encode(msg) -> bytes`."""

to_scheduler = msgspec.msgpack.Decoder(_channel_union(m.ToScheduler))
to_worker = msgspec.msgpack.Decoder(_channel_union(m.ToWorker))
from_worker = msgspec.msgpack.Decoder(_channel_union(m.FromWorker))
to_detokenizer = msgspec.msgpack.Decoder(_channel_union(m.ToDetokenizer))
to_tokenizer = msgspec.msgpack.Decoder(_channel_union(m.ToTokenizer))
control = msgspec.msgpack.Decoder(_channel_union(m.Control))

CHANNELS: dict[type, msgspec.msgpack.Decoder] = {
    m.ToScheduler: to_scheduler,
    m.ToWorker: to_worker,
    m.FromWorker: from_worker,
    m.ToDetokenizer: to_detokenizer,
    m.ToTokenizer: to_tokenizer,
    m.Control: control,
}
"""Channel base class -> its decoder (the tests round-trip every message through these)."""
