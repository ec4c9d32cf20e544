"""``python -m worker_proc RUN_DIR [GENERATION]``: run the MLX worker against launch's run
directory; GENERATION (default 0) counts launch's restarts of the worker.

``python -m worker_proc --rank R --hostfile FILE --attach HOST:PORT --dist-key-file KEY``:
run tensor-parallel rank R started by hand, on any host (`worker_proc.proc.main_attached`).
Anything else that starts with ``-`` (``-h``) or no argument at all is the second form's, whose
usage then says what it needs."""

import sys

from worker_proc.proc import main, main_attached

if __name__ == "__main__":
    if not sys.argv[1:] or sys.argv[1].startswith("-"):
        main_attached(sys.argv[1:])
    else:
        main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
