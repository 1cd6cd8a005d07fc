"""spark-submit entrypoint of the change feed; see `coldharbor.serve.changes` (`--help` for options)."""

import sys

from coldharbor.serve.changes import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
