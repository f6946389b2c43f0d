"""Benchmarks of trio_coord: each module is a script (``python bench/NAME.py``).

Every benchmark measures the system against a limit taken in the same run (the
machines are shared and noisy, so only ratios travel) and prints an aligned
table or, with ``--json``, one JSON object; :mod:`bench._common` holds what
they share (percentiles, output, child processes).
"""
