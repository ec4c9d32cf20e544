"""A start-up check: can the HTTP front listen where it was told to (`check_listen`)?"""

from __future__ import annotations

import errno
import socket


def check_listen(host: str, port: int) -> None:
    """Raise `OSError` (with its reason) when the HTTP front could not listen on `host`:`port`,
    so that the start fails in a second instead of after every process has loaded: the port is
    taken (EADDRINUSE), `host` does not resolve, or none of its addresses is on this host
    (EADDRNOTAVAIL). Binds as uvicorn (asyncio's ``create_server``) does, each released at
    once: every address `host` resolves to (all interfaces for ""), with SO_REUSEADDR; an
    address this host does not have is skipped while another one binds. Other errors are left
    for the HTTP front to report."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(e.errno, f"{host} does not resolve ({e.strerror})") from None
    except OSError:
        return
    bound, missing = False, None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
                bound = True
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise
                if e.errno == errno.EADDRNOTAVAIL:
                    missing = e
    if missing is not None and not bound:
        raise OSError(missing.errno, f"{missing.strerror} (no address of {host} is on this host)")
