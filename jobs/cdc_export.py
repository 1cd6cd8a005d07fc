"""spark-submit entrypoint of the CDC export; see `coldharbor.export` (`--help` for options)."""

import sys

from coldharbor.export import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
