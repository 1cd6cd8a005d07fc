"""spark-submit entrypoint of the change feed; see `coldharbor.changes` (`--help` for options)."""

import sys

from coldharbor.changes import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
