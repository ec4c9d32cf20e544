"""Hostfiles as users write them for ``mlx.launch --hostfile``, for the multi-host tests."""

from __future__ import annotations

import json


def hosts_json(*ips: list[str], ssh: str = "h") -> str:
    """A hostfile in the format users write for ``mlx.launch --hostfile``: one host entry
    per rank, with the IPs `ips` (one list per rank)."""
    return json.dumps([{"ssh": f"{ssh}{r}", "ips": list(addrs)} for r, addrs in enumerate(ips)])
