"""Comparing training methods on one task: the statistics (`stats`) that
`python -m pipeline.compare` and the learning bench (bench/learning.py) share."""
