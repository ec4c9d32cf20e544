"""``python -m scheduler_proc RUN_DIR``: run the scheduler against launch's run directory."""

import sys

from scheduler_proc.proc import main

if __name__ == "__main__":
    main(sys.argv[1])
