"""``python -m detokenizer_proc RUN_DIR INDEX``: run detokenizer replica INDEX."""

import sys

from detokenizer_proc.proc import main

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
