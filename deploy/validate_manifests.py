"""Validate rendered manifests: Kubernetes schemas, custom resources' schemas, and the embedded content.

    python -m deploy.validate_manifests --k8s-version 1.30.0 --node-dir DIR FILE ...

Each FILE is a multi-document YAML stream (`helm template` or `kubectl kustomize` output). Checks:
- built-in kinds against kubernetes-validate's strict schemas (unknown fields are errors);
- custom resources with validate_crs.mjs (runtime schema) and tsc over the packaged types (unknown
  fields), from the npm packages in --node-dir: monitoring.coreos.com kinds from
  @kubernetes-models/prometheus-operator, keda.sh kinds (ScaledObject) from @kubernetes-models/keda;
- every PrometheusRule's spec equals rules/ rendered for the thresholds given with --rules-args
  (`rooflight rules` flags), every dashboard ConfigMap holds a dashboards/json file byte for byte;
- the autoscaling examples' content (deploy/autoscaling.py): the KEDA triggers' and the
  prometheus-adapter config's own schemas (deploy/schemas/, written from those projects' docs), their
  queries read recording rules rules/ generates, every HPA metric is served by an adapter rule;
- every pod volume has exactly one source.
Run by deploy/validate.sh, which pins and installs the tools.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from deploy import autoscaling

REPO = Path(__file__).resolve().parent.parent
# API groups of the custom resources deploy/ ships, and the npm package whose schemas and types check them
# (validate.sh installs them in --node-dir; validate_crs.mjs imports the same).
CR_PACKAGES = {"monitoring.coreos.com": "@kubernetes-models/prometheus-operator", "keda.sh": "@kubernetes-models/keda"}


def cr_package(doc: dict[str, Any]) -> str | None:
    """The npm package holding the schema of this custom resource's group; None for a built-in kind."""
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    return CR_PACKAGES.get(group)


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def expected_rules(rules_args: str) -> dict[str, Any]:
    """The PrometheusRule spec `rooflight rules` prints for these flags (the rules/ code, not a copy)."""
    from rooflight.rules.generate import config_from_args, register, scope
    from rooflight.rules.render import prometheus_rule

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["rules", *shlex.split(rules_args)])
    return prometheus_rule(config_from_args(args), scope(args))["spec"]


def check_volumes(where: str, doc: dict[str, Any], errors: list[str]) -> None:
    """One source per pod volume: the schemas allow several, the API server refuses them (values merged
    by Helm, e.g. an emptyDir over the default's persistentVolumeClaim, end up with two)."""
    spec = doc.get("spec", {}).get("template", {}).get("spec", {}) if doc.get("kind") == "Deployment" else {}
    for volume in spec.get("volumes", []):
        sources = sorted(k for k in volume if k != "name")
        if len(sources) != 1:
            errors.append(f"{where}: volume {volume.get('name')} has {len(sources)} sources ({', '.join(sources)})")


def check_content(where: str, doc: dict[str, Any], rules_spec: dict[str, Any], errors: list[str]) -> None:
    if doc["kind"] == "PrometheusRule" and doc["spec"] != rules_spec:
        errors.append(f"{where}: PrometheusRule spec differs from what rules/ generates")
    if doc["kind"] == "ConfigMap" and doc["metadata"].get("annotations", {}).get("grafana_folder"):
        for name, text in doc.get("data", {}).items():
            source = REPO / "dashboards" / "json" / name
            if not source.is_file() or source.read_text(encoding="utf-8").rstrip("\n") != text.rstrip("\n"):
                errors.append(f"{where}: dashboard {name} differs from dashboards/json/{name}")


def ts_source(docs: list[tuple[str, dict[str, Any]]]) -> str:
    """Object literals typed by the packages' interfaces: tsc reports unknown fields (excess properties)."""
    lines = []
    for i, (where, doc) in enumerate(docs):
        kind = doc["kind"]
        lines.append(f'import type {{ I{kind} as T{i} }} from "{cr_package(doc)}/{doc["apiVersion"]}/{kind}";')
        lines.append(f"// {where}\nexport const d{i}: T{i} = {json.dumps(doc)};")
    return "\n".join(lines) + "\n"


def check_crs(docs: list[tuple[str, dict[str, Any]]], node_dir: Path, errors: list[str]) -> None:
    here = Path(__file__).resolve().parent
    script = node_dir / "validate_crs.mjs"  # run from node_dir so node finds its node_modules
    script.write_text((here / "validate_crs.mjs").read_text())
    payload = json.dumps([{"where": w, "doc": d} for w, d in docs])
    run = subprocess.run(["node", str(script)], input=payload, text=True, capture_output=True)
    print(run.stdout.strip())
    if run.returncode:
        errors.append(f"custom resource schemas: {run.stdout.strip()}{run.stderr.strip()}")
    ts = node_dir / "crs.ts"
    ts.write_text(ts_source(docs))
    tsc = subprocess.run([str(node_dir / "node_modules/.bin/tsc"), "--noEmit", "--strict", "--skipLibCheck",
                          "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", str(ts)],
                         text=True, capture_output=True, cwd=node_dir)
    if tsc.returncode:
        errors.append(f"custom resource types (tsc):\n{tsc.stdout}{tsc.stderr}")
    else:
        print(f"{len(docs)} custom resources type-check (no unknown fields)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--k8s-version", default="1.30.0")
    parser.add_argument("--node-dir", type=Path, required=True)
    parser.add_argument("--rules-args", action="append", default=[],
                        help="FILE=FLAGS: the `rooflight rules` flags FILE's PrometheusRule was rendered for")
    args = parser.parse_args(argv)
    rules_args = dict(item.split("=", 1) for item in args.rules_args)
    errors: list[str] = []
    crs: list[tuple[str, dict[str, Any]]] = []
    every: list[tuple[str, dict[str, Any]]] = []
    counted = 0
    for path in args.files:
        spec = expected_rules(rules_args.get(path.name, ""))
        for i, doc in enumerate(load(path)):
            where = f"{path.name}#{i} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            counted += 1
            check_content(where, doc, spec, errors)
            check_volumes(where, doc, errors)
            every.append((where, doc))
            if cr_package(doc):
                crs.append((where, doc))
                continue
            try:
                kubernetes_validate.validate(doc, args.k8s_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{where}: {exc.message} at {'/'.join(map(str, exc.path))}")
            except kubernetes_validate.SchemaNotFoundError as exc:
                errors.append(f"{where}: no Kubernetes schema: {exc}")
    print(f"{counted - len(crs)} Kubernetes resources checked against the {args.k8s_version} strict schemas")
    if crs:
        check_crs(crs, args.node_dir, errors)
    scaling = autoscaling.check(every)
    errors += scaling
    kinds = sorted({d["kind"] for _, d in every if d.get("kind") in ("ScaledObject", "HorizontalPodAutoscaler")
                    or autoscaling.adapter_config(d) is not None})
    if kinds and not scaling:
        print(f"autoscaling content checked ({', '.join(kinds)}): trigger and adapter schemas, rules read, "
              "HPA metrics served")
    for error in errors:
        print(f"FAIL {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
