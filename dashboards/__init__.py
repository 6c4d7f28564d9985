"""Grafana dashboards as code.

The generator modules (overview, roofline, kvbatch, gpu, fleet; shared.py holds the panels several of them
show) build classic Grafana dashboard JSON
(schemaVersion 39: Grafana 10.4 to 13) with grafana-foundation-sdk, a dev-time dependency
(`pip install 'rooflight[dashboards]'`). The rendered JSON is checked in under dashboards/json/ so the
agent and its users never need the SDK; `python -m rooflight.dashboards.generate --check` fails when the
checked-in files differ from what the code generates. dashboards/provisioning/ is a Grafana
provisioning folder (datasource + dashboard provider) to mount as is.
"""
