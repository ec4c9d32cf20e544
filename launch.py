"""``python launch.py [--model PATH] ...``: start, supervise and stop every lazyserve process
(the `launcher` package; ``lazyserve``, the console script, is the same)."""

import sys

from launcher.main import main

if __name__ == "__main__":
    sys.exit(main())
