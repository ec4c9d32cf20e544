"""``python -m worker_proc RUN_DIR``: run the MLX worker against launch's run directory."""

import sys

from worker_proc.proc import main

if __name__ == "__main__":
    main(sys.argv[1])
