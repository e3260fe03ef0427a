"""`python -m pipeline.evaluate`: see pipeline/evaluate/cli.py."""

import sys

from pipeline.evaluate.cli import main

sys.exit(main())
