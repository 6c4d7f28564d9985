"""The incident catalogue: what on-call must be paged for, and what must stay quiet.

Each incident is the series a Prometheus holds for two replicas (pods `llm-a` and `llm-b` of one vLLM
Deployment in namespace `llm`, each with its Rooflight sidecar, scraped by a PodMonitor: the agent's job
`rooflight`, the engine's `vllm`), one sample a minute for 90 minutes, built from a healthy pod
(`healthy_pod`) and the incident's changes to it. tests/rules/test_incidents.py replays every incident
through the shipped rules/rooflight.rules.yaml with promtool and reads `ALERTS{alertstate="firing"}` at each
check: exactly the alerts listed fire, each naming its pod, and nothing else. docs/incidents.md is this
catalogue as a table (generated from it, and checked).

The numbers: Llama-3-8B (16.06e9 weight bytes, 131,072 KV bytes per token) on one H100 (3.35e12 B/s). A
healthy pod runs 145 engine steps/s with 16 requests and its KV pool (100,000 tokens) 40% full. Its agent
counts what a step reads as its MBU does (rooflight_model_streamed_bytes_total): the weights less the input
embedding table with one row of it a token (15.0103e9 B at 55 tokens a step) plus the 5.24288e9 B of live
KV, 20.2532e9 B; x 145 / 3.35e12 = 88% of the bandwidth (the weights alone 65%), well above the low-MBU
line (30%). It finishes 10 requests/s, every first token within 2.5 s and every token within 0.1 s (the SLO
thresholds).
"""

from __future__ import annotations

from dataclasses import dataclass

MINUTES = 90
SAMPLES = MINUTES + 1  # one a minute, 0m to 90m
NS, CLUSTER, MODEL = "llm", "prod", "llama-3-8b"
PODS = ("llm-a", "llm-b")
A, B = PODS

Series = dict[str, str]  # promtool series selector -> its values (promtool's expanding notation)
Alert = tuple[str, str, str, str]  # (alertname, severity, pod or "", the burn row's long window or "")
Delivery = tuple[str, str, str]  # (Alertmanager receiver, alertname, pod or ""): one notification of it


@dataclass(frozen=True)
class Check:
    """At `at`, exactly the alerts in `firing` fire, and no other."""

    at: str
    firing: frozenset[Alert] = frozenset()


@dataclass(frozen=True)
class Incident:
    name: str
    what: str  # what happened, as on-call would tell it
    series: Series
    checks: tuple[Check, ...]
    pages: str = ""  # what must page (alert and severity), "" where nothing may
    within: str = ""  # from the onset to the page, as checked
    # Run end to end (tests/e2e/test_notifications_e2e.py: live agents, Prometheus, the shipped Alertmanager
    # config): what arrives, each exactly once, and nothing else; None where the incident is not run there.
    delivered: tuple[Delivery, ...] | None = None
    inhibited: tuple[tuple[str, str], ...] = ()  # (alertname, pod) that fire in Prometheus and never arrive


# -- values ---------------------------------------------------------------------------------------------

def num(value: float) -> str:
    """A value as promtool's notation reads it: no exponent (its `a+bxn` would read 1.6e+10 as a sum)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def flat(value: float, n: int = SAMPLES) -> str:
    return f"{num(value)}x{n - 1}"


def rising(per_minute: float, n: int = SAMPLES, start: float = 0.0) -> str:
    return f"{num(start)}+{num(per_minute)}x{n - 1}"


def gap(n: int) -> str:
    """`n` minutes with no sample (a scrape that did not happen)."""
    return f"_x{n}"


def change(before: float, at: int, after: float) -> str:
    """A gauge at `before` until minute `at`, then `after`."""
    return f"{flat(before, at)} {flat(after, SAMPLES - at)}"


def stops(per_minute: float, at: int) -> str:
    """A counter rising `per_minute` until minute `at`, then stuck."""
    return f"{rising(per_minute, at + 1)} {flat(per_minute * at, SAMPLES - at - 1)}"


def starts(per_minute: float, at: int) -> str:
    """A counter at 0 until minute `at`, then rising `per_minute`."""
    return f"{flat(0, at)} {rising(per_minute, SAMPLES - at)}"


def absent_until(at: int, values: str) -> str:
    """No sample before minute `at`; `values` (SAMPLES - at of them) from then on."""
    return f"{gap(at)} {values}"


# -- series ---------------------------------------------------------------------------------------------

def _selector(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def agent(pod: str, metric: str, **labels: str) -> str:
    """A series of the pod's agent, with the labels its scrape adds (its `up` has the same: up())."""
    return _selector(metric, {"cluster": CLUSTER, "namespace": NS, "pod": pod, "job": "rooflight",
                              "instance": f"{pod}:9746", **labels})


def rank(pod: str, metric: str, **labels: str) -> str:
    """A per-rank series of the pod's agent (its target is named after the pod, as the chart does)."""
    return agent(pod, metric, target=pod, engine="vllm", model=MODEL, rank="0", **labels)


def engine(pod: str, metric: str, **labels: str) -> str:
    """A series of the engine's own /metrics, scraped from the same pod under the engine's job."""
    return _selector(metric, {"cluster": CLUSTER, "namespace": NS, "pod": pod, "job": "vllm", "model_name": MODEL,
                              **labels})


def http(pod: str, status: str) -> str:
    """The engine's API server's responses to chat requests by status class (vLLM's, no model label)."""
    return _selector("http_requests_total", {"cluster": CLUSTER, "namespace": NS, "pod": pod, "job": "vllm",
                                             "handler": "/v1/chat/completions", "method": "POST", "status": status})


def canary(pod: str, result: str) -> str:
    """The agent's canary requests by result (`rooflight run --canary`)."""
    return agent(pod, "rooflight_engine_canary_requests_total", source="engine", target=pod, result=result)


def gpu(pod: str, metric: str) -> str:
    return agent(pod, metric, gpu="0", uuid=f"GPU-{pod}")


def client(pod: str, status: str, finish_reason: str) -> str:
    """The proxy's request counter (rooflight run --proxy-listen in the pod's sidecar)."""
    return agent(pod, "rooflight_client_requests_total", target=pod, route="chat", stream="true", status=status,
                 finish_reason=finish_reason, tenant="")


def up(pod: str) -> str:
    return _selector("up", {"cluster": CLUSTER, "namespace": NS, "pod": pod, "job": "rooflight",
                            "instance": f"{pod}:9746"})


RANK_SERIES = ("rooflight_engine_steps_total", "rooflight_generation_tokens_total", "rooflight_prompt_tokens_total",
               "rooflight_requests_running", "rooflight_requests_waiting", "rooflight_kv_cache_usage_ratio",
               "rooflight_kv_cache_capacity_tokens", "rooflight_batch_occupancy_ratio", "rooflight_preemptions_total",
               "rooflight_head_of_line_blocking", "rooflight_itl_tail_inflation",
               "rooflight_batch_capacity_capped", "rooflight_batch_admission_bound",
               "rooflight_model_streamed_bytes_total")
BYTES_PER_STEP = 20.2532e9  # what a healthy pod's step reads, as its agent counts it (see the module docstring)
TTFT, ITL = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"
# The series that exist only once the engine answers: the agent's per-rank series and the engine's own.
ENGINE_FED = (*RANK_SERIES, "vllm:", "http_requests_total")


def healthy_pod(pod: str, n: int = SAMPLES) -> Series:
    """Every series one healthy pod gives Prometheus over `n` minutes: the agent's (its canary on, as the
    chart runs it: `rooflight run --canary`), its GPU's and the engine's own."""
    values = (rising(145 * 60, n), rising(2000 * 60, n), rising(6000 * 60, n), flat(16, n), flat(0, n),
              flat(0.4, n), flat(100000, n), flat(0.06, n), flat(0, n), flat(0, n), flat(1.1, n), flat(0, n),
              flat(0, n), rising(BYTES_PER_STEP * 145 * 60, n))
    s: Series = {rank(pod, m): v for m, v in zip(RANK_SERIES, values)}
    s |= {
        up(pod): flat(1, n),
        agent(pod, "rooflight_source_up", source="engine", target=pod): flat(1, n),
        agent(pod, "rooflight_source_starting", source="engine", target=pod): flat(0, n),
        canary(pod, "ok"): flat(0, n),  # the canary asks only an engine its detector calls stalled
        canary(pod, "failed"): flat(0, n),
        agent(pod, "rooflight_source_up", source="nvml", target="node"): flat(1, n),
        agent(pod, "rooflight_source_starting", source="nvml", target="node"): flat(0, n),
        agent(pod, "rooflight_model_weight_bytes", target=pod, model=MODEL): flat(16e9, n),
        agent(pod, "rooflight_model_kv_cache_bytes_per_token", target=pod, model=MODEL): flat(131072, n),
        agent(pod, "rooflight_tensor_parallel_size", target=pod, model=MODEL): flat(1, n),
        agent(pod, "rooflight_gpu_peak_memory_bandwidth_bytes_per_second", target=pod): flat(3.35e12, n),
        gpu(pod, "rooflight_gpu_up"): flat(1, n),
        gpu(pod, "rooflight_gpu_xid_errors_total"): flat(0, n),
        gpu(pod, "rooflight_gpu_ecc_uncorrected_errors_total"): flat(0, n),
        gpu(pod, "rooflight_gpu_remapped_rows_pending"): flat(0, n),
        gpu(pod, "rooflight_gpu_remapped_rows_failure"): flat(0, n),
        gpu(pod, "rooflight_gpu_clock_event_reasons"): flat(4, n),  # the power cap: a busy GPU, not a fault
        gpu(pod, "rooflight_gpu_temperature_celsius"): flat(62, n),
        engine(pod, f"{TTFT}_count"): rising(600, n),
        engine(pod, f"{TTFT}_bucket", le="2.5"): rising(600, n),
        engine(pod, f"{ITL}_count"): rising(120000, n),
        engine(pod, f"{ITL}_bucket", le="0.1"): rising(120000, n),
        engine(pod, "vllm:request_success_total", finished_reason="length"): rising(600, n),
        engine(pod, "vllm:request_success_total", finished_reason="abort"): flat(0, n),
        http(pod, "2xx"): rising(600, n),
    }
    return s


def fleet(n: int = SAMPLES, **changes: Series) -> Series:
    """Both pods healthy for `n` minutes, then each pod's changes (keyword: the pod's name with `_` for `-`)."""
    out: Series = {}
    for pod in PODS:
        out |= healthy_pod(pod, n)
        out |= changes.get(pod.replace("-", "_"), {})
    return out


def without(series: Series, *metrics: str) -> Series:
    """`series` less every series of `metrics` (a name, or a name prefix ending in ':')."""
    return {k: v for k, v in series.items() if not k.split("{", 1)[0].startswith(metrics)}


def fires(*alerts: Alert) -> frozenset[Alert]:
    return frozenset(alerts)


def quiet(*at: str) -> tuple[Check, ...]:
    return tuple(Check(t) for t in at)


# -- the incidents --------------------------------------------------------------------------------------

ENGINE_DOWN_A: Alert = ("RooflightEngineDown", "warning", A, "")
MODEL_DOWN: Alert = ("RooflightModelDown", "critical", "", "")
GPU_LOST: Alert = ("RooflightGPULost", "critical", A, "")
STALLED: Alert = ("RooflightEngineStalled", "critical", A, "")

def _hung(pod: str, at: int) -> Series:
    """The engine stops at minute `at` holding 8 running and 20 waiting; its /metrics still answers. The agent's
    detector sees the stall within half a minute; from the next minute its canary, a 1-token request sent every
    half minute, goes unanswered."""
    s = {rank(pod, "rooflight_engine_steps_total"): stops(145 * 60, at),
         rank(pod, "rooflight_model_streamed_bytes_total"): stops(BYTES_PER_STEP * 145 * 60, at),
         rank(pod, "rooflight_generation_tokens_total"): stops(2000 * 60, at),
         rank(pod, "rooflight_prompt_tokens_total"): stops(6000 * 60, at),
         rank(pod, "rooflight_requests_running"): change(16, at, 8),
         rank(pod, "rooflight_requests_waiting"): change(0, at, 20),
         engine(pod, f"{TTFT}_count"): stops(600, at), engine(pod, f"{TTFT}_bucket", le="2.5"): stops(600, at),
         engine(pod, f"{ITL}_count"): stops(120000, at), engine(pod, f"{ITL}_bucket", le="0.1"): stops(120000, at),
         engine(pod, "vllm:request_success_total", finished_reason="length"): stops(600, at),
         http(pod, "2xx"): stops(600, at), canary(pod, "failed"): starts(2, at + 1)}
    return s


def _idle(pod: str) -> Series:
    s = {rank(pod, m): flat(v) for m, v in (("rooflight_engine_steps_total", 5e5), ("rooflight_generation_tokens_total", 9e5),
                                            ("rooflight_model_streamed_bytes_total", 5e5 * BYTES_PER_STEP),
                                            ("rooflight_prompt_tokens_total", 7e5), ("rooflight_requests_running", 0),
                                            ("rooflight_kv_cache_usage_ratio", 0), ("rooflight_batch_occupancy_ratio", 0))}
    s |= {engine(pod, f"{TTFT}_count"): flat(5000), engine(pod, f"{TTFT}_bucket", le="2.5"): flat(5000),
          engine(pod, f"{ITL}_count"): flat(9e5), engine(pod, f"{ITL}_bucket", le="0.1"): flat(9e5),
          engine(pod, "vllm:request_success_total", finished_reason="length"): flat(5000), http(pod, "2xx"): flat(5000)}
    return s


def _loading(pod: str, minutes: int) -> Series:
    """A new pod whose engine loads its model for `minutes` (connections refused): the agent has no engine
    series yet and says starting; then it serves like the others, its counters from 0."""
    s = {k: " ".join(["_"] * minutes + _expand(v)[: SAMPLES - minutes])
         for k, v in healthy_pod(pod).items() if k.startswith(ENGINE_FED)}
    s |= {agent(pod, "rooflight_source_up", source="engine", target=pod): change(0, minutes, 1),
          agent(pod, "rooflight_source_starting", source="engine", target=pod): change(1, minutes, 0)}
    return s


def _stuck(pod: str) -> Series:
    """A new pod whose engine never comes up (a bad image, weights that do not fit)."""
    s = {k: gap(SAMPLES) for k in healthy_pod(pod) if k.startswith(ENGINE_FED)}
    s |= {agent(pod, "rooflight_source_up", source="engine", target=pod): flat(0),
          agent(pod, "rooflight_source_starting", source="engine", target=pod): flat(1)}
    return s


def _is_counter(key: str) -> bool:
    return key.split("{", 1)[0].endswith(("_total", "_count", "_bucket"))


def _down(pod: str, minutes: set[int], n: int = SAMPLES, *, engine_serves: bool = False) -> Series:
    """The pod's engine fails every one of its agent's samples at `minutes` (refused, a 503, a page that is not an
    engine's: the agent's verdict is the same, down, as it has served before): the agent says so
    (rooflight_source_up 0, starting 0) and drops the engine's series once they are stale. Unless the engine
    still serves (`engine_serves`: only the agent's samples time out), Prometheus's own scrape of the engine
    fails too, and each time it answers again it is a new process, its counters from 0."""
    out: Series = {}
    for key, value in healthy_pod(pod, n).items():
        if not key.startswith(ENGINE_FED) or (engine_serves and not key.startswith(RANK_SERIES)):
            continue
        values, written, base = _expand(value), [], 0.0
        for m in range(n):
            if m in minutes:
                written.append("_")
                continue
            if m and m - 1 in minutes and _is_counter(key) and not engine_serves:
                base = float(values[m - 1])  # a new process: its counters from 0 a minute ago
            written.append(num(float(values[m]) - base) if _is_counter(key) else values[m])
        out[key] = " ".join(written)
    out[agent(pod, "rooflight_source_up", source="engine", target=pod)] = \
        " ".join("0" if m in minutes else "1" for m in range(n))
    return out


def _crash_loop(pod: str, at: int, n: int = SAMPLES) -> Series:
    """Up, then from minute `at` the engine crashes and restarts with back-off: down 5 min, up 1, again."""
    return _down(pod, {m for m in range(at, n) if (m - at) % 6 < 5}, n)


def _agent_restart(series: Series, pod: str, at: int) -> Series:
    """The pod's agent restarts at minute `at`: none of its series is scraped that minute, and it has forgotten
    the engine's model and series (it exports them again only once the engine answers)."""
    out = dict(series)
    for key, value in series.items():
        if key.startswith("rooflight_") and f'pod="{pod}"' in key:
            values = _expand(value)
            values[at] = "_"
            out[key] = " ".join(values)
    return out


def _stuck_gauges(pod: str, at: int, canary_answers: bool) -> Series:
    """A mass client abort at minute `at` leaves vLLM's gauges stuck: 12 running with nothing running, no new
    request (a quiet night), every counter flat. With the canary (`canary_answers`) the agent's 1-token request
    a minute later is answered, which steps the engine once and unsticks its gauges."""
    s = _idle(pod)  # vLLM counts a client's disconnect as no finish reason at all: its counters stay flat
    s |= {rank(pod, "rooflight_requests_running"): change(0, at, 12)}
    if canary_answers:
        after = at + 1
        s |= {rank(pod, "rooflight_requests_running"): f"{flat(0, at)} 12 {flat(0, SAMPLES - at - 1)}",
              canary(pod, "ok"): change(0, after, 1),
              rank(pod, "rooflight_engine_steps_total"): change(5e5, after, 5e5 + 1),
              rank(pod, "rooflight_generation_tokens_total"): change(9e5, after, 9e5 + 1)}
    return s


def _without_canary(pod: str) -> Series:
    """The pod's agent runs without --canary: no canary series at all."""
    return {canary(pod, result): gap(SAMPLES) for result in ("ok", "failed")}


def _night(pod: str, per_hour: int, slow: int) -> Series:
    """`per_hour` requests an hour, evenly spread, of 200 tokens each; the last `slow` of every hour's slower
    than 2.5 s to their first token and than 0.1 s between their tokens."""
    gap_min = 60 / per_hour
    arrivals = [round(i * gap_min) for i in range(int(SAMPLES / gap_min) + 1) if round(i * gap_min) < SAMPLES]
    bad = {t for i, t in enumerate(arrivals) if i % per_hour >= per_hour - slow}
    count = [sum(1 for t in arrivals if t <= m) for m in range(SAMPLES)]
    good = [sum(1 for t in arrivals if t <= m and t not in bad) for m in range(SAMPLES)]
    s = _idle(pod)
    s |= {engine(pod, f"{TTFT}_count"): " ".join(map(str, count)),
          engine(pod, f"{TTFT}_bucket", le="2.5"): " ".join(map(str, good)),
          engine(pod, f"{ITL}_count"): " ".join(str(200 * c) for c in count),
          engine(pod, f"{ITL}_bucket", le="0.1"): " ".join(str(200 * g) for g in good),
          engine(pod, "vllm:request_success_total", finished_reason="length"): " ".join(map(str, count)),
          http(pod, "2xx"): " ".join(map(str, count))}
    return s


def _lost_gpu(pod: str, at: int) -> Series:
    """The pod's GPU falls off the bus at minute `at`: NVML answers GPU_IS_LOST, which the agent exports as
    rooflight_gpu_up 0 and nothing else for that GPU; the engine on it dies (its port refuses)."""
    s = {k: absent_after(v, at) for k, v in healthy_pod(pod).items() if k.startswith("rooflight_gpu_")}
    s[gpu(pod, "rooflight_gpu_up")] = change(1, at, 0)
    return s | _down(pod, set(range(at, SAMPLES)))


def absent_after(values: str, at: int) -> str:
    """`values` until minute `at`, then no sample."""
    return " ".join(_expand(values)[:at] + ["_"] * (SAMPLES - at))


def _detector(pod: str, flag: str, at: int, **gauges: float) -> Series:
    s = {rank(pod, flag): change(0, at, 1)}
    s |= {rank(pod, m): change(v0, at, v1) for m, (v0, v1) in gauges.items()}  # type: ignore[misc]
    return s


def _low_traffic(pod: str, at: tuple[int, ...], slow: int) -> Series:
    """`len(at)` requests in 90 minutes, at those minutes, the last `slow` of them over 2.5 s."""
    count = [sum(1 for t in at if t <= m) for m in range(SAMPLES)]
    good = [sum(1 for t in at[: len(at) - slow] if t <= m) for m in range(SAMPLES)]
    s = _idle(pod)
    s |= {engine(pod, f"{TTFT}_count"): " ".join(map(str, count)),
          engine(pod, f"{TTFT}_bucket", le="2.5"): " ".join(map(str, good)),
          engine(pod, "vllm:request_success_total", finished_reason="length"): " ".join(map(str, count))}
    return s


def _prometheus_restart(series: Series, at: int, minutes: int) -> Series:
    """Prometheus down from minute `at` for `minutes`: no sample of anything in the gap."""
    out = {}
    for k, v in series.items():
        values = _expand(v)
        out[k] = " ".join(values[:at] + ["_"] * minutes + values[at + minutes:])
    return out


def _expand(values: str) -> list[str]:
    """promtool's notation written out, one token a minute (only what this module writes)."""
    out: list[str] = []
    for token in values.split():
        if token.startswith("_x"):
            out += ["_"] * int(token[2:])
        elif "x" in token:
            head, n = token.rsplit("x", 1)
            if "+" in head:
                start, step = head.split("+", 1)
                out += [num(float(start) + float(step) * i) for i in range(int(n) + 1)]
            else:
                out += [head] * (int(n) + 1)
        else:
            out.append(token)
    return out


def _agent_gone(pod: str, at: int) -> Series:
    """The pod's agent crash-loops from minute `at`: its scrape fails (up 0), none of its series is scraped."""
    s = {up(pod): change(1, at, 0)}
    s |= {k: " ".join(_expand(v)[:at] + ["_"] * (SAMPLES - at))
          for k, v in healthy_pod(pod).items() if k.startswith("rooflight_")}
    return s


INCIDENTS: tuple[Incident, ...] = (
    Incident("Healthy steady", "Two replicas serve 10 requests/s each; every SLO is met.",
             fleet(), quiet("30m", "89m"),
             delivered=()),
    Incident("Idle", "Nothing to do: no request running or waiting, every counter flat.",
             fleet(llm_a=_idle(A), llm_b=_idle(B)), quiet("30m", "89m")),
    Incident("Hung engine", "llm-a's engine hangs at 20m holding 8 requests and 20 waiting; its /metrics still "
             "answers, so no source is down and no latency is observed; the agent's canary goes unanswered.",
             fleet(llm_a=_hung(A, 20)),
             (Check("21m"), Check("25m", fires(STALLED)), Check("89m", fires(STALLED))),
             "RooflightEngineStalled (critical)", "5 min",
             delivered=(("pager", "RooflightEngineStalled", A),)),
    Incident("Stuck gauges after a mass abort", "At 20m on a quiet night every client of llm-a gives up at once: "
             "then vLLM's gauges stay stuck at 12 running with nothing running and no request "
             "arriving. The agent's canary, sent once its detector sees the stall, is answered and unsticks them.",
             fleet(llm_a=_stuck_gauges(A, 20, canary_answers=True), llm_b=_idle(B)), quiet("21m", "25m", "89m"),
             delivered=()),
    Incident("Stuck gauges, agent without a canary", "The same abort on an agent run without --canary: the gauges "
             "stay stuck all night, indistinguishable on the counters from a hang.",
             fleet(llm_a={**_stuck_gauges(A, 20, canary_answers=False), **_without_canary(A)}, llm_b=_idle(B)),
             (Check("21m"), Check("25m", fires(("RooflightEngineStalled", "warning", A, ""))),
              Check("89m", fires(("RooflightEngineStalled", "warning", A, "")))),
             "RooflightEngineStalled (warning: unconfirmed)", "5 min"),
    Incident("Slow model load on rollout", "A rollout's new pod llm-b loads its model for 8 minutes (connections "
             "refused) before it serves.", fleet(llm_b=_loading(B, 8)), quiet("5m", "7m", "30m"),
             delivered=()),
    Incident("Model load that never finishes", "llm-b never comes up (a bad image, weights that do not fit).",
             fleet(llm_b=_stuck(B)),
             (Check("29m"), Check("32m", fires(("RooflightEngineStartTimeout", "warning", B, ""))),
              Check("89m", fires(("RooflightEngineStartTimeout", "warning", B, "")))),
             "RooflightEngineStartTimeout (warning)", "30 min (the load budget)"),
    Incident("Agent restarted while its engine loads", "A rollout's new pod llm-b loads its model for 8 minutes; "
             "its agent restarts at 4m, before the engine ever answered.",
             _agent_restart(fleet(llm_b=_loading(B, 8)), B, 4), quiet("5m", "7m", "30m")),
    Incident("One restart that reloads", "llm-a's engine crashes at 20m and is back 6 minutes later, its model "
             "reloaded; llm-b serves meanwhile.", fleet(llm_a=_down(A, set(range(20, 26)))),
             quiet("22m", "26m", "35m", "60m")),
    Incident("Agent samples time out", "llm-a's agent times out reading its engine for 3 minutes from 20m while "
             "the engine serves (Prometheus scrapes it fine).",
             fleet(llm_a=_down(A, set(range(20, 23)), engine_serves=True)), quiet("22m", "25m", "40m")),
    Incident("Crash loop", "llm-a's engine, up for 20 minutes, crashes and restarts with back-off (down 5 min, "
             "up 1), while llm-b serves: a ticket, not a page, and one that does not flap.",
             fleet(llm_a=_crash_loop(A, 20)),
             (Check("25m"), Check("32m", fires(ENGINE_DOWN_A)), Check("45m", fires(ENGINE_DOWN_A)),
              Check("62m", fires(ENGINE_DOWN_A)), Check("89m", fires(ENGINE_DOWN_A))),
             "RooflightEngineDown (warning)", "10 min",
             delivered=(("ticket", "RooflightEngineDown", A),)),
    Incident("Half of a model's replicas down", "llm-b's engine, up for 20 minutes, goes down and stays down "
             "(its node lost); llm-a serves.", fleet(llm_b=_down(B, set(range(20, SAMPLES)))),
             (Check("27m"), Check("31m", fires(("RooflightEngineDown", "warning", B, ""))),
              Check("89m", fires(("RooflightEngineDown", "warning", B, "")))),
             "RooflightEngineDown (warning)", "11 min",
             delivered=(("ticket", "RooflightEngineDown", B),)),
    Incident("Model-wide crash loop", "Both engines crash-loop from 20m (down 5 min, up 1, a bad config pushed to "
             "both): the model pages once, and stays paged through the minutes it is up.",
             fleet(llm_a=_crash_loop(A, 20), llm_b=_crash_loop(B, 20)),
             (Check("21m"), Check("23m", fires(MODEL_DOWN)),
              Check("27m", fires(MODEL_DOWN)),
              Check("45m", fires(MODEL_DOWN, ENGINE_DOWN_A, ("RooflightEngineDown", "warning", B, ""))),
              Check("89m", fires(MODEL_DOWN, ENGINE_DOWN_A, ("RooflightEngineDown", "warning", B, "")))),
             "RooflightModelDown (critical), RooflightEngineDown (warning, each pod's; inhibited under the page)",
             "3 min"),
    Incident("Agent restarted during an outage", "From 20m both engines answer 503 (their engines dead); llm-a's "
             "agent restarts at 21m, before anything paged, and finds its engine answering 503.",
             _agent_restart(fleet(llm_a=_down(A, set(range(20, SAMPLES))), llm_b=_down(B, set(range(20, SAMPLES)))),
                            A, 21),
             (Check("21m"), Check("23m", fires(MODEL_DOWN)),
              Check("45m", fires(MODEL_DOWN, ENGINE_DOWN_A, ("RooflightEngineDown", "warning", B, "")))),
             "RooflightModelDown (critical), RooflightEngineDown (warning, each pod's; inhibited under the page)",
             "3 min",
             delivered=(("pager", "RooflightModelDown", ""),),
             inhibited=(("RooflightEngineDown", A), ("RooflightEngineDown", B))),
    Incident("KV wall", "llm-a's KV cache fills at 20m: 98% full, preempting, 12 waiting; its detector holds.",
             fleet(llm_a=_detector(A, "rooflight_batch_capacity_capped", 20,
                                   rooflight_kv_cache_usage_ratio=(0.4, 0.98), rooflight_requests_waiting=(0, 12))),
             (Check("25m"), Check("45m", fires(("RooflightBatchCapacityCapped", "warning", A, "")))),
             "RooflightBatchCapacityCapped (warning)", "25 min",
             delivered=(("ticket", "RooflightBatchCapacityCapped", A),)),
    Incident("Head-of-line blocking", "Long prompts stall llm-a's decode batch from 20m: its worst ITL 6x its "
             "median, the detector holds.",
             fleet(llm_a=_detector(A, "rooflight_head_of_line_blocking", 20,
                                   rooflight_itl_tail_inflation=(1.1, 6.0))),
             (Check("21m"), Check("35m", fires(("RooflightHeadOfLineBlocking", "warning", A, "")))),
             "RooflightHeadOfLineBlocking (warning)", "15 min"),
    Incident("Admission-bound", "From 20m, 30 requests wait on llm-a while its batch is 20% of its cap and KV "
             "30% full (a scheduler or gateway limit).",
             fleet(llm_a=_detector(A, "rooflight_batch_admission_bound", 20,
                                   rooflight_requests_waiting=(0, 30), rooflight_batch_occupancy_ratio=(0.06, 0.2))),
             (Check("25m"), Check("45m", fires(("RooflightBatchAdmissionBound", "warning", A, "")))),
             "RooflightBatchAdmissionBound (warning)", "25 min"),
    Incident("Abort storm", "From 20m the engines abort 300 requests a minute each, as they count them "
             "(SGLang's aborted counter counts clients that give up; vLLM's abort and error finish reasons count "
             "what the engine ends itself: vLLM 0.32 counts a client's disconnect as neither, the proxy does).",
             fleet(llm_a={engine(A, "vllm:request_success_total", finished_reason="abort"): starts(300, 20)},
                   llm_b={engine(B, "vllm:request_success_total", finished_reason="abort"): starts(300, 20)}),
             # a third of the requests failing burns the 1h window past 14.4 x 1% after ~11 minutes
             (Check("20m"), Check("30m"), Check("36m", fires(("RooflightRequestErrorBudgetBurn", "critical", "", "1h")))),
             "RooflightRequestErrorBudgetBurn (critical)", "16 min"),
    Incident("Upstream 5xx through the proxy", "From 20m the engines behind llm-a's and llm-b's proxies fail 30 of "
             "100 requests a minute with 502: one page for the model, not one per pod.",
             fleet(llm_a={client(A, "200", "stop"): rising(70), client(A, "502", "none"): starts(30, 20)},
                   llm_b={client(B, "200", "stop"): rising(70), client(B, "502", "none"): starts(30, 20)}),
             (Check("20m"), Check("30m", fires(("RooflightClientErrorBudgetBurn", "critical", "", "1h")))),
             "RooflightClientErrorBudgetBurn (critical)", "10 min"),
    Incident("5xx without a proxy", "From 20m 3% of the model's requests are answered 5xx on both pods, as the "
             "engine's own API server counts them; no proxy in front.",
             fleet(llm_a={http(A, "2xx"): rising(582), http(A, "5xx"): starts(18, 20)},
                   llm_b={http(B, "2xx"): rising(582), http(B, "5xx"): starts(18, 20)}),
             (Check("35m"), Check("45m", fires(("RooflightClientErrorBudgetBurn", "critical", "", "1h")))),
             "RooflightClientErrorBudgetBurn (critical)", "25 min",
             delivered=(("pager", "RooflightClientErrorBudgetBurn", ""),)),
    Incident("XID error", "llm-a's GPU reports a double-bit ECC error (XID 48) at 30m and stays on the bus.",
             fleet(llm_a={gpu(A, "rooflight_gpu_xid_errors_total"): change(0, 30, 1),
                          gpu(A, "rooflight_gpu_xid_last_code"): absent_until(30, flat(48, SAMPLES - 30))}),
             (Check("29m"), Check("31m", fires(("RooflightGPUHardwareXid", "critical", A, "")))),
             "RooflightGPUHardwareXid (critical)", "1 min"),
    Incident("Lost GPU", "llm-a's GPU falls off the bus (XID 79) at 30m: NVML answers GPU_IS_LOST, the engine on "
             "it dies. The page stays while the GPU is gone.", fleet(llm_a=_lost_gpu(A, 30)),
             (Check("30m"), Check("32m", fires(GPU_LOST)),
              Check("50m", fires(GPU_LOST, ENGINE_DOWN_A)), Check("89m", fires(GPU_LOST, ENGINE_DOWN_A))),
             "RooflightGPULost (critical), RooflightEngineDown (warning; inhibited under the page)", "2 min",
             delivered=(("pager", "RooflightGPULost", A),), inhibited=(("RooflightEngineDown", A),)),
    Incident("Thermal throttling", "llm-b's GPU overheats from 20m: 90 C and the HW thermal slowdown bit set.",
             fleet(llm_b={gpu(B, "rooflight_gpu_clock_event_reasons"): change(4, 20, 68),
                          gpu(B, "rooflight_gpu_temperature_celsius"): change(62, 20, 90)}),
             (Check("22m"), Check("40m", fires(("RooflightGPUThrottled", "warning", B, ""),
                                               ("RooflightGPUHot", "warning", B, "")))),
             "RooflightGPUThrottled, RooflightGPUHot (warning)", "20 min"),
    Incident("One of two replicas degraded", "llm-b decodes at 20 steps/s from the start (a slow node) while "
             "llm-a is healthy.",
             fleet(llm_b={rank(B, "rooflight_engine_steps_total"): rising(20 * 60),
                          rank(B, "rooflight_model_streamed_bytes_total"): rising(BYTES_PER_STEP * 20 * 60)}),
             (Check("30m"), Check("40m", fires(("RooflightLowDecodeMBU", "warning", B, "")))),
             "RooflightLowDecodeMBU (warning), naming llm-b only", "35 min"),
    Incident("Engine histograms missing", "Prometheus does not scrape the engines' /metrics (only the agents'): "
             "the TTFT and ITL SLOs have nothing to read.",
             without(fleet(), "vllm:"),
             (Check("10m"), Check("20m", fires(("RooflightSLOHistogramMissing", "warning", A, ""),
                                               ("RooflightSLOHistogramMissing", "warning", B, "")))),
             "RooflightSLOHistogramMissing (warning)", "15 min"),
    Incident("Low traffic, two slow requests", "A quiet hour: 3 requests in 40 minutes on llm-a, the last two "
             "slower than 2.5 s (67% of the hour's requests).",
             fleet(llm_a=_low_traffic(A, (10, 20, 38), slow=2), llm_b=_idle(B)), quiet("40m", "60m")),
    Incident("Quiet night, four slow requests", "24 requests an hour on llm-a, each of 200 tokens; the last 4 of "
             "each hour slow to their first token and between their tokens (17% of the hour's requests).",
             fleet(llm_a=_night(A, 24, 4), llm_b=_idle(B)), quiet("40m", "60m", "89m")),
    Incident("Prometheus restart", "Prometheus is down from 40m for 10 minutes: no sample of anything, then "
             "scraping resumes.", _prometheus_restart(fleet(), 40, 10), quiet("51m", "55m", "70m")),
    Incident("Fresh Prometheus during a slow burn", "Prometheus starts with no data (a new pod on an emptyDir) "
             "while 8% of first tokens take over 2.5 s on both replicas: a burn of 8x, over the 6h row's 6x and "
             "under the 1h row's 14.4x, that would spend 5% of the budget only if it lasted six hours.",
             fleet(llm_a={engine(A, f"{TTFT}_bucket", le="2.5"): rising(552)},
                   llm_b={engine(B, f"{TTFT}_bucket", le="2.5"): rising(552)}), quiet("30m", "89m")),
    Incident("Agent down", "llm-a's agent crash-loops from 20m: its scrape fails and its series go stale.",
             fleet(llm_a=_agent_gone(A, 20)),
             (Check("21m"), Check("30m", fires(("RooflightAgentDown", "warning", A, "")))),
             "RooflightAgentDown (warning)", "10 min",
             delivered=(("ticket", "RooflightAgentDown", A),)),
)

# A model launched with a slow-prefill bug: 10% of its first tokens over 2.5 s from its first request, a burn of
# 10x: under the 1h row's 14.4x, over the 6h row's 6x, whose 5% of the budget it has spent after 3.6 hours.
INCIDENTS += (
    Incident("New model burning 10x from launch", "A model launched at 0m sends 10% of its first tokens past "
             "2.5 s on both pods: it has spent 5% of its 30-day budget after 3.6 hours.",
             fleet(300, llm_a={engine(A, f"{TTFT}_bucket", le="2.5"): rising(540, 300)},
                   llm_b={engine(B, f"{TTFT}_bucket", le="2.5"): rising(540, 300)}),
             (Check("3h"), Check("4h30m", fires(("RooflightTTFTBudgetBurn", "critical", "", "6h")))),
             "RooflightTTFTBudgetBurn (critical, the 6h row)", "4 h 30 min"),
)

def delivered_text(incident: Incident) -> str:
    """The incident's notifications, as the end-to-end stage checks them arrive (each once), and what it
    checks never arrives though it fired."""
    if incident.delivered is None:
        return "not run end to end"
    sent = "; ".join(f"{receiver}: {name}{f' ({pod})' if pod else ''}" for receiver, name, pod in incident.delivered)
    held = ", ".join(f"{name} ({pod})" for name, pod in incident.inhibited)
    return (sent or "none") + (f"; inhibited: {held}" if held else "")


def markdown() -> str:
    """docs/incidents.md's table (generated: `python tests/rules/incidents.py`)."""
    rows = ["| incident | what happens | pages | within | stays quiet | notifications delivered |",
            "|---|---|---|---|---|---|"]
    for i in INCIDENTS:
        checked = ", ".join(c.at for c in i.checks)
        rows.append(f"| {i.name} | {i.what} | {i.pages or 'nothing'} | {i.within or '-'} | "
                    f"{'every other alert' if i.pages else 'every alert'} (checked at {checked}) | "
                    f"{delivered_text(i)} |")
    return "\n".join(rows) + "\n"


def summary() -> str:
    """README's line on the catalogue."""
    alerted = [i for i in INCIDENTS if i.pages]
    critical = sum(1 for i in alerted if any(a[1] == "critical" for c in i.checks for a in c.firing))
    run = [i for i in INCIDENTS if i.delivered is not None]
    pages = sum(1 for i in run for d in i.delivered or () if d[0] == "pager")
    tickets = sum(1 for i in run for d in i.delivered or () if d[0] == "ticket")
    return (f"{len(INCIDENTS)} incidents replayed through the shipped rules: {len(alerted)} alert as they must "
            f"({critical} page critical, {len(alerted) - critical} open a warning), {len(INCIDENTS) - len(alerted)} "
            f"stay quiet, 0 false alerts; {len(run)} of them run end to end through a real Alertmanager deliver "
            f"{pages} pages and {tickets} tickets, each once, and nothing else")


if __name__ == "__main__":
    print(markdown(), end="")
