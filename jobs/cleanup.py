"""spark-submit entrypoint of cleanup; see `coldharbor.maintenance.cleanup` (`--help` for options)."""

import sys

from coldharbor.maintenance.cleanup import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
