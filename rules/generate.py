"""Write the checked-in rule files, check them for staleness, and the `rooflight rules` subcommand.

    python -m rooflight.rules.generate           # rewrite rules/rooflight.rules.yaml and rooflight.prometheusrule.yaml
    python -m rooflight.rules.generate --check   # exit 1 with a diff when the checked-in files differ from the code
    rooflight rules --ttft-threshold 1 --agent-selector 'job="rooflight"' --format prometheusrule
    rooflight rules --topology-labels cluster,namespace,pod,instance,job --extra-labels region
    rooflight rules --ttft-threshold-for llama-70b=5 --dashboard-base-url https://grafana.example.com
    rooflight rules --saturation-window 1m --capacity-window 5m   # the agent windows the capacity rules read
    rooflight rules --pod      # each cluster's Prometheus, when a central ruler runs the fleet rules
    rooflight rules --fleet    # that central ruler (Thanos, Mimir, vmalert): rules/fleet.py

The checked-in files are rendered from the default RulesConfig (rooflight-pod.rules.yaml and
rooflight-fleet.rules.yaml are the two halves of rooflight.rules.yaml plus the fleet's meta-alert);
`rooflight rules` renders the same code with the user's thresholds and selectors.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from rooflight.agent.errors import ConfigError
from rooflight.rules import config as cfg
from rooflight.rules.render import render

HERE = Path(__file__).resolve().parent
OUTPUTS = {"yaml": HERE / "rooflight.rules.yaml", "prometheusrule": HERE / "rooflight.prometheusrule.yaml"}
# The fleet split (rules/fleet.py), by scope: rules files for a cluster's Prometheus and the central ruler.
SPLIT_OUTPUTS = {"pod": HERE / "rooflight-pod.rules.yaml", "fleet": HERE / "rooflight-fleet.rules.yaml"}


def _files(outputs: dict[str, Path], split: dict[str, Path]) -> list[tuple[Path, str, str]]:
    """(path, format, scope) of every checked-in file."""
    return [(path, fmt, "all") for fmt, path in outputs.items()] + [(path, "yaml", s) for s, path in split.items()]


def _preset(engine: str) -> dict[str, Any]:
    """One engine's histogram names, default thresholds and bucket edges, and (failed, finished)
    requests for the availability SLO (rules/availability.py), from its adapter's ServiceFamilies."""
    families = cfg.service_families(engine)
    return {
        slo: (h.name, cfg.default_threshold(target, h.edges), h.edges)
        for slo, h, target in (
            ("ttft", families.ttft, cfg.TTFT_TARGET_SECONDS), ("itl", families.itl, cfg.ITL_TARGET_SECONDS),
        )
    } | {"requests": (families.requests_failed, families.requests_finished)}  # fmt: skip


# Per engine whose adapter declares the families the rules read (docs/engines.md, section ITL and
# TPOT per engine).
ENGINE_PRESETS: dict[str, dict[str, Any]] = {engine: _preset(engine) for engine in cfg.slo_engines()}


def check(outputs: dict[str, Path] = OUTPUTS, config: cfg.RulesConfig | None = None,
          split: dict[str, Path] = SPLIT_OUTPUTS) -> int:
    """0 when every checked-in file equals what the code renders; 1 with a unified diff otherwise."""
    config = config or cfg.RulesConfig()
    stale = 0
    for path, fmt, scope in _files(outputs, split):
        want = render(config, fmt, scope)
        have = path.read_text() if path.exists() else ""
        if have != want:
            stale = 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    have.splitlines(keepends=True), want.splitlines(keepends=True), str(path), f"{path} (generated)"
                )
            )
    if stale:
        print("rules are stale: run `python -m rooflight.rules.generate`", file=sys.stderr)
    return stale


def write(outputs: dict[str, Path] = OUTPUTS, config: cfg.RulesConfig | None = None,
          split: dict[str, Path] = SPLIT_OUTPUTS) -> None:
    config = config or cfg.RulesConfig()
    for path, fmt, scope in _files(outputs, split):
        path.write_text(render(config, fmt, scope))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooflight.rules.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail with a diff if the checked-in files are stale")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    write()
    return 0


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise ConfigError(f"bucket edges must be comma-separated numbers ({text!r})") from exc


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def register(subparsers: Any) -> None:
    """Add `rooflight rules` to the agent's CLI; the handler returns an exit code."""
    p = subparsers.add_parser(
        "rules",
        help="print Prometheus rules and alerts for your thresholds and selectors",
        description="Print Rooflight's recording rules, detector alerts, TTFT/ITL burn-rate SLO alerts and the "
                    "client-side goodput burn-rate alerts.",
    )
    p.add_argument("--format", choices=("yaml", "prometheusrule"), default="yaml")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--pod", dest="scope", action="store_const", const="pod", default="all",
                       help="only the pod-level rules: each cluster's Prometheus, where a central ruler runs --fleet")
    scope.add_argument("--fleet", dest="scope", action="store_const", const="fleet",
                       help="only the rules that sum over replicas, plus RooflightClusterAbsent: the central "
                            "ruler (Thanos, Mimir, vmalert) of clusters that remote-write to one store")
    p.add_argument("--cluster-label", default=cfg.RulesConfig.cluster_label,
                   help="the topology label naming a cluster, for RooflightClusterAbsent (default %(default)s)")
    p.add_argument("--cluster-absent-for", default=cfg.RulesConfig.cluster_absent_for,
                   help="how long a cluster's agents may not reach the central ruler before "
                        "RooflightClusterAbsent (--fleet; default %(default)s)")
    p.add_argument("--release", default="", help="label release=<this> on the PrometheusRule (kube-prometheus-stack)")
    p.add_argument("--name", default="rooflight", help="PrometheusRule name and group-name prefix")
    p.add_argument("--agent-selector", default="", help="matchers for rooflight_* series, e.g. 'job=\"rooflight\"'")
    p.add_argument("--topology-labels", default=",".join(cfg.TOPOLOGY_LABELS),
                   help="comma list of the labels Prometheus attaches to a scrape, kept by every rule "
                        "('' = none; default %(default)s)")
    p.add_argument("--replica-labels", default=",".join(cfg.REPLICA_LABELS),
                   help="the topology labels that tell replicas apart; SLOs sum over them (default %(default)s)")
    p.add_argument("--extra-labels", default="", help="comma list of more labels to keep (region,...)")
    p.add_argument("--engine", choices=sorted(ENGINE_PRESETS), default=cfg.DEFAULT_ENGINE, help="histogram names and edges")
    p.add_argument("--engine-selector", default="", help="matchers for the engine's TTFT/ITL histograms")
    p.add_argument("--slo-group-by", default="model_name", help="comma list of labels each SLO is computed by")
    for slo, title in (("ttft", "time to first token"), ("itl", "inter-token latency")):
        p.add_argument(f"--{slo}-metric", help=f"{title} histogram base name (default: the engine's)")
        p.add_argument(f"--{slo}-threshold", type=float, help=f"{title} SLO threshold in seconds (a bucket edge)")
        p.add_argument(f"--{slo}-objective", type=float, default=0.99, help="share of observations within it")
        p.add_argument(f"--{slo}-buckets", help="the histogram's bucket edges if customised ('' = unknown)")
        p.add_argument(f"--{slo}-threshold-for", action="append", default=[], metavar="MODEL=SECONDS",
                       help=f"{title} threshold for one model (repeat per model; a bucket edge)")
    p.add_argument("--goodput-objective", type=float, default=cfg.RulesConfig.goodput_objective,
                   help="share of the proxy's judged requests that must meet every target of each --slo "
                        "(goodput burn-rate alerts; default %(default)s)")
    p.add_argument("--request-error-objective", type=float, default=cfg.RulesConfig.request_error_objective,
                   help="share of the engine's finished requests that must not be aborted or failed (default %(default)s)")
    p.add_argument("--client-error-objective", type=float, default=cfg.RulesConfig.client_error_objective,
                   help="share of the proxy's inference requests that must not get a 5xx or an upstream error "
                        "(default %(default)s)")
    p.add_argument("--slo-min-requests", type=int, default=cfg.RulesConfig.slo_min_requests,
                   help="requests a burn row's long window must hold before it can fire (default %(default)s)")
    p.add_argument("--slo-model-label", default=cfg.RulesConfig.slo_model_label,
                   help="the engine's label naming the model, for --*-threshold-for (default %(default)s)")
    p.add_argument("--low-mbu-threshold", type=float, default=cfg.RulesConfig.low_mbu_threshold)
    p.add_argument("--low-mbu-for", default=cfg.RulesConfig.low_mbu_for)
    p.add_argument("--hol-for", default=cfg.RulesConfig.head_of_line.for_)
    p.add_argument("--capacity-capped-for", default=cfg.RulesConfig.capacity_capped.for_)
    p.add_argument("--admission-bound-for", default=cfg.RulesConfig.admission_bound.for_)
    p.add_argument("--source-down-for", default=cfg.RulesConfig.source_down_for)
    p.add_argument("--engine-start-budget", default=cfg.RulesConfig.engine_start_budget,
                   help="how long an engine may load (no good sample since the agent started) before "
                        "RooflightEngineStartTimeout; until then it is starting, not down (default %(default)s)")
    p.add_argument("--engine-stalled-for", default=cfg.RulesConfig.engine_stalled_for,
                   help="how long after a window of no progress with requests held the stall pages (default %(default)s)")
    p.add_argument("--gpu-temperature-threshold", type=float, default=cfg.RulesConfig.gpu_temperature_celsius,
                   help="degrees C a GPU must hold for the whole health window to alert (default %(default)s)")
    p.add_argument("--gpu-throttle-share", type=float, default=cfg.RulesConfig.gpu_throttle_share,
                   help="share of the health window in thermal or power-brake slowdown that alerts (default %(default)s)")
    p.add_argument("--agent-job-selector", default=cfg.RulesConfig.agent_job_selector,
                   help="matchers for the agent's own scrape in `up` (meta-monitoring; default %(default)s)")
    p.add_argument("--agent-down-for", default=cfg.RulesConfig.agent_down_for)
    p.add_argument("--agent-absent-for", default=cfg.RulesConfig.agent_absent_for)
    p.add_argument("--itl-short-window", default=cfg.RulesConfig.itl_short_window,
                   help="the agent's shortest --windows entry, quoted by the head-of-line alert (default %(default)s)")
    p.add_argument("--itl-long-window", default=cfg.RulesConfig.itl_long_window,
                   help="the agent's longest --windows entry (default %(default)s)")
    p.add_argument("--saturation-window", default=cfg.RulesConfig.saturation_window,
                   help="the agent's --windows entry the autoscaling saturation record reads (default %(default)s)")
    p.add_argument("--capacity-window", default=cfg.RulesConfig.capacity_window,
                   help="the agent's --windows entry the groups-needed record reads capacity over "
                        "(default %(default)s)")
    p.add_argument("--runbook-base-url", default=cfg.RulesConfig.runbook_base_url)
    p.add_argument("--dashboard-base-url", default=cfg.RulesConfig.dashboard_base_url,
                   help="Grafana's URL; each alert's dashboard_url is <this>/d/<uid>?var-pod=... (default %(default)s)")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    p.set_defaults(func=run_rules)


def _per_model(items: Sequence[str], flag: str) -> tuple[tuple[str, float], ...]:
    """MODEL=SECONDS items of a repeated flag."""
    out = []
    for item in items:
        model, sep, seconds = item.rpartition("=")
        try:
            out.append((model, float(seconds)))
        except ValueError:
            raise ConfigError(f"{flag} {item!r}: write MODEL=SECONDS, e.g. llama-70b=5") from None
        if not sep or not model:
            raise ConfigError(f"{flag} {item!r}: write MODEL=SECONDS, e.g. llama-70b=5")
    return tuple(out)


def _slo(args: argparse.Namespace, slo: str, alert: str, title: str) -> cfg.LatencySLO:
    metric, threshold, buckets = ENGINE_PRESETS[args.engine][slo]
    given = getattr(args, f"{slo}_buckets")
    return cfg.LatencySLO(
        name=slo,
        alert=alert,
        title=title,
        histogram=getattr(args, f"{slo}_metric") or metric,
        selector=args.engine_selector,
        threshold_seconds=getattr(args, f"{slo}_threshold") or threshold,
        objective=getattr(args, f"{slo}_objective"),
        buckets=buckets if given is None else _floats(given),
        by_model=_per_model(getattr(args, f"{slo}_threshold_for"), f"--{slo}-threshold-for"),
    )


def config_from_args(args: argparse.Namespace) -> cfg.RulesConfig:
    """The RulesConfig a `rooflight rules` command line describes; ConfigError when it is inconsistent."""
    base = cfg.RulesConfig()
    return replace(
        base,
        agent_selector=args.agent_selector,
        topology_labels=_names(args.topology_labels),
        replica_labels=_names(args.replica_labels),
        extra_labels=_names(args.extra_labels),
        slo_group_by=_names(args.slo_group_by),
        slo_model_label=args.slo_model_label,
        ttft=_slo(args, "ttft", "RooflightTTFTBudgetBurn", "time to first token"),
        itl=_slo(args, "itl", "RooflightITLBudgetBurn", "inter-token latency"),
        goodput_objective=args.goodput_objective,
        request_error_objective=args.request_error_objective,
        slo_engine=args.engine,
        requests_failed=ENGINE_PRESETS[args.engine]["requests"][0],
        requests_finished=ENGINE_PRESETS[args.engine]["requests"][1],
        client_error_objective=args.client_error_objective,
        slo_min_requests=args.slo_min_requests,
        head_of_line=replace(base.head_of_line, for_=args.hol_for),
        capacity_capped=replace(base.capacity_capped, for_=args.capacity_capped_for),
        admission_bound=replace(base.admission_bound, for_=args.admission_bound_for),
        low_mbu_threshold=args.low_mbu_threshold,
        low_mbu_for=args.low_mbu_for,
        source_down_for=args.source_down_for,
        engine_stalled_for=args.engine_stalled_for,
        engine_start_budget=args.engine_start_budget,
        gpu_temperature_celsius=args.gpu_temperature_threshold,
        gpu_throttle_share=args.gpu_throttle_share,
        agent_job_selector=args.agent_job_selector,
        agent_down_for=args.agent_down_for,
        agent_absent_for=args.agent_absent_for,
        itl_short_window=args.itl_short_window,
        itl_long_window=args.itl_long_window,
        saturation_window=args.saturation_window,
        capacity_window=args.capacity_window,
        cluster_label=args.cluster_label,
        cluster_absent_for=args.cluster_absent_for,
        runbook_base_url=args.runbook_base_url,
        dashboard_base_url=args.dashboard_base_url,
        rule_name=args.name,
        release=args.release,
    )


def run_rules(args: argparse.Namespace) -> int:
    try:
        text = render(config_from_args(args), args.format, args.scope)
    except ConfigError as exc:
        print(f"rooflight rules: {exc}", file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
