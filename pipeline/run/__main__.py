"""`python -m pipeline.run`: see pipeline/run/cli.py."""

import sys

from pipeline.run.cli import main

sys.exit(main())
