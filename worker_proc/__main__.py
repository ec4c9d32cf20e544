"""``python -m worker_proc RUN_DIR [GENERATION]``: run the MLX worker against launch's run
directory; GENERATION (default 0) counts launch's restarts of the worker."""

import sys

from worker_proc.proc import main

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
