"""spark-submit entrypoint of compaction; see `coldharbor.maintenance.compaction` (`--help` for options)."""

import sys

from coldharbor.maintenance.compaction import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
