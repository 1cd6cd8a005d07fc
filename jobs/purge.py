"""spark-submit entrypoint of purge; see `coldharbor.maintenance.purge` (`--help` for options)."""

import sys

from coldharbor.maintenance.purge import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
