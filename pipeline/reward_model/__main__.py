"""`python -m pipeline.reward_model`: see pipeline/reward_model/cli.py."""

import sys

from pipeline.reward_model.cli import main

sys.exit(main())
