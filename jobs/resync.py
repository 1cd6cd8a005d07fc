"""spark-submit entrypoint of resync; see `coldharbor.resync` (`--help` for options)."""

import sys

from coldharbor.resync import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
