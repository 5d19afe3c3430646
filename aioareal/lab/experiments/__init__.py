"""Experiments: read run directories (one run or a sweep of them), plot them, and write a report.

`load` finds runs and names their configurations, `plots` draws the figures, `report` computes the
per-configuration table and writes report.md, `commands` holds the `plot` and `report` subcommands.
"""
