"""spark-submit entrypoint of resync; see `coldharbor.maintenance.resync` (`--help` for options)."""

import sys

from coldharbor.maintenance.resync import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
