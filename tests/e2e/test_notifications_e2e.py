"""What an on-call team receives, end to end: real agents, the shipped rules on a real Prometheus, the shipped
Alertmanager config on a real Alertmanager (Debian's), and a webhook of the test's own as the pager and the
ticket queue. The notifications stage of .ci/test (marker `notifications`).

Eleven incidents of the catalogue (tests/rules/incidents.py) run at once, each in a namespace of its own: two
pods of one model (`llm-a`, `llm-b`), each a `rooflight demo` (the simulated vLLM, the fake NVML, the real
agent, its canary on) failing on a schedule (`--fault`), or an agent of its own (`rooflight run`) that the test
restarts or kills. Prometheus scrapes every agent (job `rooflight`) and engine (job `vllm`) with the
namespace and pod a PodMonitor would add, every second, and evaluates `rooflight rules --time-scale 20`: the
shipped rules with every duration divided by 20 (a rule-minute is 3 s), as the Alertmanager config's waits
are (deploy/alertmanager.py, config(time_scale)); nothing else differs from what ships.

For each incident the test checks what arrived: each notification the catalogue declares (receiver, alert,
pod), exactly once (a re-fire after a resolve, a second group, would be a second arrival), and nothing else;
and that each alert it declares inhibited did fire in Prometheus and never arrived. Over all incidents, every
critical alert that fired arrived exactly once or was inhibited, and so every warning. docs/incidents.md's
"notifications delivered" column is these declarations.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import amstack
import promstack
from demo_procs import rooflight_command, start_rooflight, stop_process
from deploy import alertmanager
from support import TESTS

if str(TESTS / "rules") not in sys.path:  # the catalogue lives beside its promtool replay
    sys.path.insert(0, str(TESTS / "rules"))
from incidents import INCIDENTS, Incident  # noqa: E402

pytestmark = [pytest.mark.notifications, pytest.mark.prometheus]

SCALE = 20  # every duration of the rules and of Alertmanager's waits / 20: a rule-minute is 3 s
ONSET = 30.0  # seconds from the start to each fault: 10 rule-minutes of health first
WATCH = 190.0  # seconds from the start the stage watches: 53 rule-minutes, past every declared page
SETTLE = 25.0  # then the notifications in flight arrive (Alertmanager's group_interval, 15 s, and margin)
# Prometheus scrapes and evaluates every 2 s, each scrape given 2 s: 22 Python processes on two shared cores
# answer a scrape late now and then (a late scrape is no evidence either way: rules/outage.py).
SCRAPE = "2s"
CLUSTER = "e2e"
AGENT_FLAGS = ("--interval", "1s", "--canary", "--detector", "stall_seconds=2", "--log-level", "warning")


@dataclass(frozen=True)
class Pod:
    name: str
    scenario: str = "steady"
    faults: tuple[str, ...] = ()
    agent: str = "demo"  # demo: the demo's own agent; run: `rooflight run` against the demo's engine
    restart_at: float | None = None  # the `run` agent restarts then (seconds from the start)
    kill_at: float | None = None  # the whole pod's process dies then


@dataclass(frozen=True)
class Scenario:
    incident: str  # its name in the catalogue
    namespace: str
    pods: tuple[Pod, ...]


def _at(t: float) -> str:
    return f"{t:g}s"


SCENARIOS = (
    Scenario("Healthy steady", "healthy", (Pod("llm-a"), Pod("llm-b"))),
    Scenario("Hung engine", "hung", (Pod("llm-a", faults=(f"hang@{_at(ONSET)}",)), Pod("llm-b"))),
    Scenario("Stuck gauges after a mass abort", "stuck",
             (Pod("llm-a", faults=(f"stuck-gauges@{_at(ONSET)}",)), Pod("llm-b", "idle"))),
    Scenario("Slow model load on rollout", "rollout", (Pod("llm-a"), Pod("llm-b", faults=("down@0s:24s",)))),
    Scenario("Crash loop", "crash", (Pod("llm-a", faults=(f"crash-loop@{_at(ONSET)}:15s:3s",)), Pod("llm-b"))),
    Scenario("Half of a model's replicas down", "half", (Pod("llm-a"), Pod("llm-b", faults=(f"down@{_at(ONSET)}",)))),
    Scenario("Agent restarted during an outage", "restart",
             (Pod("llm-a", faults=(f"503@{_at(ONSET)}",), agent="run", restart_at=ONSET + 2),
              Pod("llm-b", faults=(f"503@{_at(ONSET)}",)))),
    Scenario("KV wall", "kvwall", (Pod("llm-a", "kv-wall"), Pod("llm-b"))),
    Scenario("Lost GPU", "gpu", (Pod("llm-a", faults=(f"gpu-lost@{_at(ONSET)}",)), Pod("llm-b"))),
    Scenario("Agent down", "agentdown", (Pod("llm-a", kill_at=ONSET), Pod("llm-b"))),
    Scenario("5xx without a proxy", "fivexx",
             (Pod("llm-a", faults=(f"5xx@{_at(ONSET)}:5%",)), Pod("llm-b", faults=(f"5xx@{_at(ONSET)}:5%",)))),
)


def incident(name: str) -> Incident:
    return next(i for i in INCIDENTS if i.name == name)


@dataclass
class Running:
    """A pod's processes and addresses: its agent (scraped) and its engine (scraped)."""

    pod: Pod
    namespace: str
    agent: str
    engine: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    run_agent: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        fault_flags = [f for spec in self.pod.faults for f in ("--fault", spec)]
        listen = self.agent if self.pod.agent == "demo" else f"127.0.0.1:{promstack.free_port()}"
        self.procs.append(start_rooflight("demo", "--scenario", self.pod.scenario, "--listen", listen,
                                          "--engine-listen", self.engine, "--target-name", self.pod.name,
                                          *fault_flags, *AGENT_FLAGS))
        if self.pod.agent == "run":
            self.run_agent = self._run_agent()

    def _run_agent(self) -> subprocess.Popen[bytes]:
        return start_rooflight("run", "--engine-url", f"http://{self.engine}", "--listen", self.agent,
                               "--target-name", self.pod.name, "--no-nvml", "--no-process", *AGENT_FLAGS)

    def restart_agent(self) -> None:
        assert self.run_agent is not None
        stop_process(self.run_agent)
        self.run_agent = self._run_agent()

    def kill(self) -> None:
        for proc in self.procs:
            proc.kill()

    def stop(self) -> str:
        out = "".join(stop_process(p) for p in self.procs)
        return out + (stop_process(self.run_agent) if self.run_agent is not None else "")


def scrape_configs(pods: list[Running]) -> list[dict[str, Any]]:
    """The agents under job `rooflight`, the engines under `vllm`, each with its namespace and pod (a PodMonitor's)."""
    def job(name: str, address: str) -> dict[str, Any]:
        return {"job_name": name, "static_configs": [
            {"targets": [getattr(p, address)], "labels": {"cluster": CLUSTER, "namespace": p.namespace, "pod": p.pod.name}}
            for p in pods]}
    return [job("rooflight", "agent"), job("vllm", "engine")]


def render_rules(path: Path) -> None:
    """The shipped rules, every duration divided by SCALE, as `rooflight rules` prints them."""
    run = subprocess.run([*rooflight_command(), "rules", "--time-scale", str(SCALE), "-o", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


# -- what arrived -------------------------------------------------------------------------------------------

Key = tuple[str, str, str]  # (receiver, alertname, pod)


def arrivals(posts: list[amstack.Post], namespace: str) -> Counter[Key]:
    """How many times each alert of `namespace` arrived firing: once per alert instance (fingerprint and the
    time it began firing), whatever the group updates that listed it again; a re-fire is a second arrival."""
    seen: dict[Key, set[tuple[str, str]]] = {}
    for post in posts:
        for a in post.body.get("alerts", []):
            labels = a["labels"]
            if a["status"] != "firing" or labels.get("namespace") != namespace:
                continue
            key = (post.receiver, labels["alertname"], labels.get("pod", ""))
            seen.setdefault(key, set()).add((a["fingerprint"], a["startsAt"]))
    return Counter({key: len(instances) for key, instances in seen.items()})


def fired(prom: promstack.PromStack, seconds: float) -> dict[str, set[tuple[str, str, str]]]:
    """Each namespace's alerts that fired in Prometheus in the last `seconds`: (alertname, pod, severity)."""
    rows = prom.query(f'max_over_time(ALERTS{{alertstate="firing", cluster="{CLUSTER}"}}[{int(seconds)}s])')
    out: dict[str, set[tuple[str, str, str]]] = {}
    for r in rows:
        m = r["metric"]
        out.setdefault(m.get("namespace", ""), set()).add((m["alertname"], m.get("pod", ""), m["severity"]))
    return out


needs_stack = pytest.mark.skipif(not (promstack.available() and amstack.available()),
                                 reason="Debian's prometheus and prometheus-alertmanager are not installed")


@needs_stack
def test_every_incident_delivers_exactly_its_notifications(tmp_path: Path) -> None:
    rules = tmp_path / "rooflight.rules.yaml"
    render_rules(rules)
    pods = [Running(pod, s.namespace, f"127.0.0.1:{promstack.free_port()}", f"127.0.0.1:{promstack.free_port()}")
            for s in SCENARIOS for pod in s.pods]
    receivers = tuple(alertmanager.RECEIVERS.values())
    with amstack.Webhook() as hook, \
            amstack.AMStack(alertmanager.config(time_scale=SCALE, urls=hook.urls(receivers))) as am:
        start = time.monotonic()
        for p in pods:
            p.start()
        errors = ""
        try:
            with promstack.PromStack([], [rules], interval=SCRAPE, scrape_configs=scrape_configs(pods),
                                     alertmanagers=[am.address], flags=["--rules.alert.resend-delay=2s"]) as prom:
                actions = sorted([(p.pod.restart_at, p.restart_agent) for p in pods if p.pod.restart_at is not None]
                                 + [(p.pod.kill_at, p.kill) for p in pods if p.pod.kill_at is not None],
                                 key=lambda a: a[0])
                for at, act in actions:
                    time.sleep(max(0.0, start + at - time.monotonic()))
                    act()
                time.sleep(max(0.0, start + WATCH - time.monotonic()))
                seen = fired(prom, time.monotonic() - start)
                time.sleep(SETTLE)
                posts = hook.received()
        finally:
            for p in pods:
                errors += p.stop()

    problems = []
    for s in SCENARIOS:
        inc = incident(s.incident)
        assert inc.delivered is not None, f"{inc.name}: the catalogue declares no delivery for it"
        got = arrivals(posts, s.namespace)
        want = Counter({d: 1 for d in inc.delivered})
        if got != want:
            problems.append(f"{inc.name}: arrived {dict(got)}, the catalogue says {dict(want)}; "
                            f"fired in Prometheus: {sorted(seen.get(s.namespace, ()))}")
        for name, pod in inc.inhibited:
            if not any(f[:2] == (name, pod) for f in seen.get(s.namespace, ())):
                problems.append(f"{inc.name}: {name} ({pod}) never fired, so its inhibition proves nothing")
            if any(k[1:] == (name, pod) for k in got):
                problems.append(f"{inc.name}: {name} ({pod}) arrived, though inhibited")
        # every alert that fired arrived (once, to its severity's receiver) or was inhibited: nothing lost
        for name, pod, severity in seen.get(s.namespace, ()):
            receiver = alertmanager.RECEIVERS.get(severity)
            if receiver and (name, pod) not in inc.inhibited and got.get((receiver, name, pod)) != 1:
                problems.append(f"{inc.name}: {severity} {name} ({pod}) fired and arrived "
                                f"{got.get((receiver, name, pod), 0)} times")
    assert not problems, "\n".join(problems) + f"\n\nagents' stderr:\n{errors[-4000:]}"
