"""`python -m pipeline.compare`: see pipeline/compare/cli.py."""

import sys

from pipeline.compare.cli import main

sys.exit(main())
