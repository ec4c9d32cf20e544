"""A request with ``n`` > 1 choices as one `GenerateReq` per choice.

Choice 0 keeps the request's rid and leads the group: choice i > 0 is ``{rid}-{i}`` with
``group = rid``, so the scheduler admits it once the shared prompt is prefilled and the
prefix cache serves it. A seeded request gives choice i the seed + i (wrapped into the
signed 64-bit range), so the choices differ yet the whole request is reproducible.
"""

from __future__ import annotations

from msgspec.structs import replace

from protocol.messages import GenerateReq

_I64 = 2**63


def choice_rid(rid: str, index: int) -> str:
    """The rid of choice `index` of request `rid` (choice 0 keeps `rid`)."""
    return rid if index == 0 else f"{rid}-{index}"


def fan_out(req: GenerateReq, n: int) -> list[GenerateReq]:
    """`req` as n choices (see the module docstring); n == 1 gives [req]."""
    out = [req]
    for i in range(1, n):
        seed = req.sampling.seed
        sampling = req.sampling if seed is None else replace(req.sampling, seed=(seed + i + _I64) % (2 * _I64) - _I64)
        out.append(replace(req, rid=choice_rid(req.rid, i), sampling=sampling, group=req.rid))
    return out
