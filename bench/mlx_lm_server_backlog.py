"""mlx_lm.server with a listen backlog of 1024 instead of `socketserver`'s 5: the stock
server (``http.server.ThreadingHTTPServer``) resets connections when tens of clients connect
at once (64 concurrent streams do it). Same flags as ``python -m mlx_lm.server``:

    python -m bench.mlx_lm_server_backlog --model DIR --port P

The kernel caps the backlog at ``net.core.somaxconn`` (4096 by default on recent Linux).
"""

from __future__ import annotations

import http.server

BACKLOG = 1024


def main() -> None:
    """Raise the backlog of every ``ThreadingHTTPServer`` (mlx_lm.server builds one) and run
    mlx_lm.server's command line."""
    from mlx_lm.server import main as mlx_lm_server_main

    http.server.ThreadingHTTPServer.request_queue_size = BACKLOG
    mlx_lm_server_main()


if __name__ == "__main__":
    main()
