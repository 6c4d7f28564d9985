"""Write the checked-in rule files, check them for staleness, and the `rooflight rules` subcommand.

    python -m rooflight.rules.generate           # rewrite rules/rooflight.rules.yaml and rooflight.prometheusrule.yaml
    python -m rooflight.rules.generate --check   # exit 1 with a diff when the checked-in files differ from the code
    rooflight rules --ttft-threshold 1 --agent-selector 'job="rooflight"' --format prometheusrule
    rooflight rules --topology-labels cluster,namespace,pod,instance,job --extra-labels region
    rooflight rules --ttft-threshold-for llama-70b=5 --dashboard-base-url https://grafana.example.com
    rooflight rules --saturation-window 1m --capacity-window 5m   # the agent windows the capacity rules read
    rooflight rules --time-scale 20   # every duration / 20: a test stage's minutes-long incidents
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

from rooflight.agent.config import settings
from rooflight.agent.config.rules_settings import detector_stem
from rooflight.agent.errors import ConfigError
from rooflight.agent.signals.detectors import Detector, detectors
from rooflight.rules import config as cfg
from rooflight.rules.render import render
from rooflight.rules.timescale import scaled

HERE = Path(__file__).resolve().parent
OUTPUTS = {"yaml": HERE / "rooflight.rules.yaml", "prometheusrule": HERE / "rooflight.prometheusrule.yaml"}
# The fleet split (rules/fleet.py), by scope: rules files for a cluster's Prometheus and the central ruler.
SPLIT_OUTPUTS = {"pod": HERE / "rooflight-pod.rules.yaml", "fleet": HERE / "rooflight-fleet.rules.yaml"}


def files(outputs: dict[str, Path], split: dict[str, Path]) -> list[tuple[Path, str, str]]:
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
    for path, fmt, scope in files(outputs, split):
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
    for path, fmt, scope in files(outputs, split):
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


def flag_defaults() -> dict[str, Any]:
    """`rooflight rules`' defaults, by setting key: the default RulesConfig's (the checked-in rules')."""
    base = cfg.RulesConfig()
    return {
        "format": "yaml", "release": base.release, "name": base.rule_name, "agent_selector": base.agent_selector,
        "topology_labels": ",".join(base.topology_labels), "replica_labels": ",".join(base.replica_labels),
        "extra_labels": ",".join(base.extra_labels), "engine": base.slo_engine, "engine_selector": base.ttft.selector,
        "slo_group_by": ",".join(base.slo_group_by), "ttft_objective": base.ttft.objective,
        "itl_objective": base.itl.objective, "ttft_threshold_for": [], "itl_threshold_for": [],
        "goodput_objective": base.goodput_objective, "request_error_objective": base.request_error_objective,
        "client_error_objective": base.client_error_objective, "slo_min_requests": base.slo_min_requests,
        "slo_model_label": base.slo_model_label, "low_mbu_threshold": base.low_mbu_threshold,
        "low_mbu_for": base.low_mbu_for, "source_down_for": base.source_down_for,
        "engine_start_budget": base.engine_start_budget, "engine_stalled_for": base.engine_stalled_for,
        "gpu_temperature_threshold": base.gpu_temperature_celsius, "gpu_throttle_share": base.gpu_throttle_share,
        "agent_job_selector": base.agent_job_selector, "agent_down_for": base.agent_down_for,
        "agent_absent_for": base.agent_absent_for, "itl_short_window": base.itl_short_window,
        "itl_long_window": base.itl_long_window, "saturation_window": base.saturation_window,
        "capacity_window": base.capacity_window, "runbook_base_url": base.runbook_base_url,
        "dashboard_base_url": base.dashboard_base_url, "cluster_label": base.cluster_label,
        "cluster_absent_for": base.cluster_absent_for, "keep_firing_for": base.keep_firing_for,
    }


def _arg(args: argparse.Namespace, d: Detector, what: str) -> Any:
    """A detector alert's `for` or severity as given (agent/config/rules_settings.py declares its flags)."""
    return getattr(args, f"{detector_stem(d).replace('-', '_')}_{what}")


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
    settings.add_flags(p, settings.RULES, defaults=flag_defaults())  # its flags: agent/config/rules_settings.py
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


# The flags of `rooflight rules` spliced into the rules as written, by kind: each is checked here first, so
# its error names the flag (the config checks them again, by their config names, for every other caller).
_DURATION_FLAGS = ("low_mbu_for", "source_down_for", "engine_stalled_for", "engine_start_budget", "agent_down_for",
                   "agent_absent_for", "itl_short_window", "itl_long_window", "saturation_window", "capacity_window",
                   "cluster_absent_for", "keep_firing_for")
_MATCHER_FLAGS = ("agent_selector", "engine_selector", "agent_job_selector")
_METRIC_FLAGS = ("ttft_metric", "itl_metric")


def _flag(key: str) -> str:
    return next(s.flag(settings.RULES) for s in settings.offered(settings.RULES) if s.key == key)


def check_flags(args: argparse.Namespace) -> None:
    """ConfigError naming the flag for a duration, selector or metric name that would render invalid PromQL
    (`--cluster-absent-for 0s`, `--agent-selector '{job="x"'`, `--ttft-metric '1bad metric'`)."""
    durations = (*_DURATION_FLAGS, *(detector_stem(d).replace("-", "_") + "_for" for d in detectors()
                                     if d.rule is not None))
    for key in durations:
        value = getattr(args, key, None)
        if value or (value is not None and key != "keep_firing_for"):  # '' leaves keep_firing_for out
            cfg.check_duration(value, _flag(key))
    for key in _MATCHER_FLAGS:
        value = getattr(args, key, None)
        if value is not None:
            cfg.check_matchers(value, _flag(key), required=key == "agent_job_selector")
    for key in _METRIC_FLAGS:
        value = getattr(args, key, None)
        if value:
            cfg.check_metric_name(value, _flag(key))


def config_from_args(args: argparse.Namespace) -> cfg.RulesConfig:
    """The RulesConfig a `rooflight rules` command line describes; ConfigError when it is inconsistent."""
    check_flags(args)
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
        detector_alerts=tuple((d.key, replace(base.detector_alert(d.key), for_=_arg(args, d, "for"),
                                              severity=_arg(args, d, "severity")))
                              for d in detectors() if d.rule is not None),
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
        keep_firing_for=args.keep_firing_for,
        runbook_base_url=args.runbook_base_url,
        dashboard_base_url=args.dashboard_base_url,
        rule_name=args.name,
        release=args.release,
    )


def scope(args: argparse.Namespace) -> str:
    """Which rules the command prints: `pod`, `fleet` (rules/fleet.py) or `all`."""
    return "pod" if args.pod else "fleet" if args.fleet else "all"


def run_rules(args: argparse.Namespace) -> int:
    try:
        text = render(scaled(config_from_args(args), args.time_scale), args.format, scope(args))
    except ConfigError as exc:
        print(f"rooflight rules: {exc}", file=sys.stderr)
        return 2
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:  # a directory, a missing folder, no permission: say so, exit 2
            print(f"rooflight rules: -o {args.output}: cannot write it ({exc.strerror or exc}); name a file in a "
                  "folder that exists", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
