#!/usr/bin/env bash
# The fleet stage (tests/fleet/, pytest -m fleet): two clusters of `rooflight demo` pods, each scraped by
# Prometheus in agent mode (one cluster an HA pair), remote-writing to a central VictoriaMetrics with
# vmalert and to a central Prometheus (remote-write receiver), both notifying one Alertmanager; one
# cluster is cut off from both stores for five minutes. Every server is a Debian package's binary
# (prometheus, victoria-metrics, prometheus-alertmanager; .ci/install installs them) started by the test on
# 127.0.0.1 with a free port and a temporary directory; the packages' own services are never used.
# About 9.5 minutes, mostly waiting (a minute of warm-up, the five-minute cut, two minutes to settle).
#
# usage: .ci/fleet.sh [extra pytest args]     env: PYTHON (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-.venv/bin/python}
# One test module whose fixture runs ~9 min: 15 min before pytest-timeout fails it.
# -rP prints what the passing tests measured (how far each store's fleet records are from the truth).
exec "$PYTHON" -m pytest -m fleet tests/fleet -q -rP -p no:cacheprovider --timeout 900 -o faulthandler_timeout=1000 "$@"
