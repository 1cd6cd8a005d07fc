"""spark-submit entrypoint of the CDC export; see `coldharbor.export.export_job` (`--help` for options)."""

import sys

from coldharbor.export.export_job import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
