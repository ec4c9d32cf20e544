"""``python -m detokenizer_proc``: run or detach a detokenizer replica.

- ``python -m detokenizer_proc RUN_DIR INDEX``: replica INDEX, as launch starts it.
- ``python -m detokenizer_proc --attach RUN_DIR``: one more replica for the server running
  in RUN_DIR (launch prints it at start-up); it takes new requests once registered.
- ``python -m detokenizer_proc --detach RUN_DIR INDEX``: drain replica INDEX (it finishes
  the requests it holds, takes no new ones, then exits) and wait until it has left.
"""

import argparse

from protocol.process import exit_now


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; exits 2 with a usage message when it is malformed."""
    p = argparse.ArgumentParser(
        prog="python -m detokenizer_proc",
        description="a lazyserve detokenizer replica",
        usage="python -m detokenizer_proc (RUN_DIR INDEX | --attach RUN_DIR | --detach RUN_DIR INDEX)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--attach", action="store_true", help="join the running server in RUN_DIR as a new replica")
    mode.add_argument(
        "--detach", action="store_true", help="drain replica INDEX of the server in RUN_DIR and wait until it left"
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the server's run directory (printed by launch.py at start-up)")
    p.add_argument("index", metavar="INDEX", type=int, nargs="?", help="replica index (not with --attach)")
    ns = p.parse_args(argv)
    if ns.attach and ns.index is not None:
        p.error("--attach takes no INDEX: the scheduler assigns one")
    if not ns.attach and ns.index is None:
        p.error("INDEX is required (or use --attach)")
    if ns.index is not None and ns.index < 0:
        p.error("INDEX must be at least 0")
    return ns


def run(argv: list[str] | None = None) -> int:
    """Dispatch to the replica or the detach command; returns the exit code."""
    ns = parse_args(argv)
    if ns.detach:
        from detokenizer_proc.detach import detach

        return detach(ns.run_dir, ns.index)
    from detokenizer_proc.proc import main

    return main(ns.run_dir, None if ns.attach else ns.index)


if __name__ == "__main__":
    exit_now(run())  # `main` closed its sockets (flushing what it sends) before returning
