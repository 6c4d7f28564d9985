"""Prometheus recording rules, alerts and SLO burn-rate rules, generated from rules/config.py.

`python -m rooflight.rules.generate` writes the checked-in YAML; `rooflight.rules.generate.register` adds `rooflight rules`.
"""
