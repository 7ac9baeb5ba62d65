"""Trellis benchmarks: figures, and ratios against a floor measured in the same run.

Run them with ``make bench`` or ``uv run python -m bench [NAME ...]``; see ``bench/README.md``
and :mod:`bench.report` for the rule every benchmark follows.
"""
