"""spark-submit entrypoint: serve one report over the unified hot/cold view (see coldharbor.serve)."""

import sys

from coldharbor.serve_cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
