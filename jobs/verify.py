"""spark-submit entrypoint of verify; see `coldharbor.verify` (`--help` for options)."""

import sys

from coldharbor.verify import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
