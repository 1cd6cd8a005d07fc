"""spark-submit entrypoint: serve one report over the unified hot/cold view (see coldharbor.serve.serve_cli and serve_job)."""

import sys

from coldharbor.serve.serve_cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
