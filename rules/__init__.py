"""Prometheus recording rules, alerts and SLO burn-rate rules, generated from rules/config.py.

`python -m rules.generate` writes the checked-in YAML; `rules.generate.register` adds `rooflight rules`.
"""
