"""``python -m tokenizer_proc RUN_DIR``: run the HTTP front against launch's run directory."""

import sys

from tokenizer_proc.proc import main

if __name__ == "__main__":
    main(sys.argv[1])
