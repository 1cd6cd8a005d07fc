"""spark-submit entrypoint of verify; see `coldharbor.maintenance.verify` (`--help` for options)."""

import sys

from coldharbor.maintenance.verify import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
