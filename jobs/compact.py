"""spark-submit entrypoint of compaction; see `coldharbor.compaction` (`--help` for options)."""

import sys

from coldharbor.compaction import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
