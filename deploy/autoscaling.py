"""Checks of the autoscaling examples (deploy/k8s/autoscaling) that no CRD or Kubernetes schema makes.

The ScaledObject's CRD schema (npm @kubernetes-models/keda) types a trigger's metadata as a map of strings,
and the adapter's rules live in a ConfigMap's string: neither schema sees a missing query, a misspelt key
or a query that reads a recording rule rules/ no longer generates. So, for every document given:

- a ConfigMap labelled app.kubernetes.io/name=prometheus-adapter: its config.yaml against
  schemas/prometheus-adapter-config.schema.json (written from the adapter's docs, see its $comment);
  each rule's series is a recording rule of rules/, its `name.matches` matches it, and its metricsQuery,
  rendered as the adapter renders it, reads only recording rules of rules/;
- a ScaledObject's prometheus triggers: their metadata against schemas/keda-prometheus-trigger.schema.json
  (written from KEDA's docs), and their query reads only recording rules of rules/;
- a HorizontalPodAutoscaler's Pods and Object metrics: each is served by an adapter rule among the documents;
- every query (a trigger's, an adapter rule's rendered metricsQuery) that reads a per-role record
  (`..._role:...`) pins one role (`role="decode"`): a sum over roles adds a prefill pool's walls to a
  decode pool's; and none scales on the saturation record, which is held to 1 (a `_ratio`): a pool at
  the wall with 100 queued would ask for x1/threshold a cold start; the saturation demand record is the
  same number while nothing queues and counts the queue past 1 (rules/capacity.py).

Run by deploy/validate_manifests.py (deploy/validate.sh); tests/deployment/test_autoscaling.py runs the
same functions on the checked-in examples and evaluates their queries with promtool.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import yaml

DEPLOY = Path(__file__).resolve().parent
SCHEMAS = DEPLOY / "schemas"
ADAPTER_SCHEMA = SCHEMAS / "prometheus-adapter-config.schema.json"
KEDA_TRIGGER_SCHEMA = SCHEMAS / "keda-prometheus-trigger.schema.json"
ADAPTER_LABEL = ("app.kubernetes.io/name", "prometheus-adapter")
ADAPTER_FILE = "config.yaml"
# A recording rule's level:metric:operations name (prometheus.io/docs/practices/rules).
RECORD = re.compile(r"(?<![\w:])[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z0-9_]+(?![\w:])")
SERIES_NAME = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
ROLES = ("both", "prefill", "decode")  # agent/signals/headroom.py ROLES
CAPPED = "rooflight_saturation"  # the metric part of the saturation records: held to 0..1
# What the adapter puts in a metricsQuery for a request about pods a and b in namespace llm.
SAMPLE_REQUEST = {"LabelMatchers": 'namespace="llm",pod=~"a|b"', "GroupBy": "pod"}

Doc = tuple[str, dict[str, Any]]  # (where, document)


@functools.cache
def records() -> frozenset[str]:
    """The names of the recording rules rules/ generates with the default config."""
    from rooflight.rules.config import RulesConfig
    from rooflight.rules.render import groups

    return frozenset(r["record"] for g in groups(RulesConfig()) for r in g["rules"] if "record" in r)


@functools.cache
def _schema(path: Path) -> dict[str, Any]:
    schema = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def schema_errors(path: Path, instance: Any) -> list[str]:
    """One line per violation of the JSON schema at `path`, with the path inside `instance`."""
    found = jsonschema.Draft7Validator(_schema(path)).iter_errors(instance)
    return [f"{'/'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in sorted(found, key=str)]


def record_errors(query: str, known: Iterable[str]) -> list[str]:
    """The query must read at least one recording rule, and only ones rules/ generates."""
    named = set(RECORD.findall(query))
    if not named:
        return [f"reads no Rooflight recording rule: {query}"]
    return [f"reads {name}, which rules/ does not generate" for name in sorted(named - set(known))]


def signal_errors(query: str) -> list[str]:
    """A query on per-role records must pin one role, and must not scale on the capped saturation."""
    errors = []
    named = RECORD.findall(query)
    if any(name.split(":")[0].endswith("_role") for name in named) and not any(
            f'role="{role}"' in query for role in ROLES):
        errors.append(f"reads a per-role record without a role matcher (role=\"decode\", ...): {query}")
    for name in sorted({n for n in named if n.split(":")[1] == CAPPED}):
        errors.append(f"scales on {name}, held to 1: a burst behind the wall asks for only x1/threshold a "
                      f"cold start; read {name.replace(':' + CAPPED + ':', ':' + CAPPED + '_demand:')}")
    return errors


def render_metrics_query(template: str, series: str, request: dict[str, str] = SAMPLE_REQUEST) -> str:
    """The PromQL the adapter sends for `request` (its <<.Series>>, <<.LabelMatchers>>, <<.GroupBy>>)."""
    text = template.replace("<<.Series>>", series)
    for key, value in request.items():
        text = text.replace(f"<<.{key}>>", value)
    return text


def adapter_config(doc: dict[str, Any]) -> Any:
    """The parsed config.yaml of the adapter's ConfigMap; None for any other document."""
    labels = doc.get("metadata", {}).get("labels") or {}
    if doc.get("kind") != "ConfigMap" or labels.get(ADAPTER_LABEL[0]) != ADAPTER_LABEL[1]:
        return None
    return yaml.safe_load((doc.get("data") or {}).get(ADAPTER_FILE, "") or "") or {}


def served_metrics(config: Any) -> set[str]:
    """The custom-metric names the adapter's rules serve (their `name.as`, or the series name)."""
    out = set()
    for rule in (config or {}).get("rules", []) if isinstance(config, dict) else []:
        match = SERIES_NAME.match(str(rule.get("seriesQuery", "")))
        out.add((rule.get("name") or {}).get("as") or (match.group(1) if match else ""))
    return out - {""}


def adapter_errors(config: Any, known: Iterable[str]) -> list[str]:
    """Schema, then each rule: a known series, a name regex that matches it, a metricsQuery over records."""
    errors = schema_errors(ADAPTER_SCHEMA, config)
    if errors:
        return errors
    for i, rule in enumerate(config.get("rules", [])):
        match = SERIES_NAME.match(rule["seriesQuery"])
        if not match:
            errors.append(f"rules/{i}: seriesQuery names no metric: {rule['seriesQuery']}")
            continue
        series = match.group(1)
        errors += [f"rules/{i} seriesQuery: {e}" for e in record_errors(series, known)]
        pattern = (rule.get("name") or {}).get("matches") or ".*"
        if not re.fullmatch(pattern, series):
            errors.append(f"rules/{i}: name.matches {pattern!r} does not match its series {series}")
        query = render_metrics_query(rule["metricsQuery"], series)
        errors += [f"rules/{i} metricsQuery: {e}" for e in record_errors(query, known) + signal_errors(query)]
    return errors


def keda_errors(doc: dict[str, Any], known: Iterable[str]) -> list[str]:
    """Each prometheus trigger of a ScaledObject: its metadata's schema, and its query's records."""
    errors = []
    for i, trigger in enumerate(doc.get("spec", {}).get("triggers", [])):
        if trigger.get("type") != "prometheus":
            continue
        metadata = trigger.get("metadata") or {}
        errors += [f"triggers/{i}/metadata/{e}" for e in schema_errors(KEDA_TRIGGER_SCHEMA, metadata)]
        query = str(metadata.get("query", ""))
        errors += [f"triggers/{i} query: {e}" for e in record_errors(query, known) + signal_errors(query)]
    return errors


def hpa_errors(doc: dict[str, Any], served: set[str]) -> list[str]:
    """Every Pods or Object metric of an HPA must be one the adapter rules among the documents serve."""
    errors = []
    for i, metric in enumerate(doc.get("spec", {}).get("metrics", [])):
        kind = {"Pods": "pods", "Object": "object"}.get(metric.get("type", ""))
        name = ((metric.get(kind) or {}).get("metric") or {}).get("name") if kind else None
        if name is not None and name not in served:
            known = ", ".join(sorted(served)) or "none"
            errors.append(f"metrics/{i}: {name} is served by no prometheus-adapter rule here ({known})")
    return errors


def check(docs: list[Doc], known: Iterable[str] | None = None) -> list[str]:
    """Every error of the autoscaling documents among `docs`, as `where: message` lines."""
    known = records() if known is None else frozenset(known)
    errors: list[str] = []
    served: set[str] = set()
    for where, doc in docs:
        config = adapter_config(doc)
        if config is not None:
            errors += [f"{where}: {e}" for e in adapter_errors(config, known)]
            served |= served_metrics(config)
    for where, doc in docs:
        if doc.get("apiVersion") == "keda.sh/v1alpha1" and doc.get("kind") == "ScaledObject":
            errors += [f"{where}: {e}" for e in keda_errors(doc, known)]
        if doc.get("apiVersion") == "autoscaling/v2" and doc.get("kind") == "HorizontalPodAutoscaler":
            errors += [f"{where}: {e}" for e in hpa_errors(doc, served)]
    return errors
