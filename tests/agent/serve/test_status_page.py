"""The status page's data (/api/v1/status), its roofline SVG and its routes, without a browser.

Snapshots come from the real agent sampling the demo engine over HTTP with one fake clock driving both
(as tests/e2e/test_demo_agent.py does), so the numbers are the agent's own, not hand-made.
"""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rooflight.agent.demo import DemoConfig, DemoEngine
from rooflight.agent.metrics.snapshot import Snapshot
from rooflight.agent.roofline import physics
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.metrics.history import HISTORY_FIELDS, Sparklines
from rooflight.agent.serve import page, status
from rooflight.agent.serve.roofline_svg import render_roofline
from rooflight.agent.serve.server import snapshot_dict
from rooflight.agent.signals.detectors import Verdicts, detectors
from support import ROOT, started_agent

SVG = "{http://www.w3.org/2000/svg}"


@asynccontextmanager
async def _demo(scenario: str, seconds: float, **flags: object) -> AsyncIterator[tuple[DemoEngine, Agent, FakeClock]]:
    """The demo engine and an agent (no loops) on one fake clock, `seconds` in; both always stopped."""
    clock = FakeClock()
    engine = DemoEngine(DemoConfig(scenario=scenario, seed=3), clock=clock)
    await engine.start()
    try:
        settings = {"engine_url": [engine.url], "process": False, "nvml": False, "interval": "0.5",
                    "windows": "10s,1m", **flags}
        async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
            await advance(engine, agent, clock, seconds)
            yield engine, agent, clock
    finally:
        await engine.stop()


async def advance(engine: DemoEngine, agent: Agent, clock: FakeClock, seconds: float, step: float = 0.5) -> None:
    for _ in range(round(seconds / step)):
        clock.advance(step)
        engine.tick()
        await agent.sample_engines_once()


@pytest.fixture
async def steady() -> AsyncIterator[tuple[DemoEngine, Agent, FakeClock]]:
    async with _demo("steady", 20.0, batch_max=256) as demo:
        yield demo


def _series(st: dict) -> dict:
    (target,) = st["targets"]
    (series,) = target["series"]
    return series


# -- the data ----------------------------------------------------------------------------------------

async def test_status_numbers_are_the_snapshot_numbers(steady: tuple) -> None:
    _, agent, _ = steady
    snap = agent.snapshot
    st, plain = status.status_dict(snap), snapshot_dict(snap)
    ours, theirs = _series(st), plain["targets"][0]["series"][0]
    assert ours["windows"], "the 10 s window should be full after 20 s"
    for mine, shown in zip(ours["windows"], theirs["windows"]):
        for key in ("window", "mbu", "mfu", "tokens_per_second", "ttft", "itl", "decode_intensity",
                    "preemptions_per_second"):
            assert mine[key] == shown[key], key
    for key in ("running", "waiting", "kv_usage_ratio", "batch_max"):
        assert ours[key] == theirs[key], key
    assert [h["up"] for h in st["health"]] == [h["up"] for h in plain["health"]]


async def test_decode_sits_left_of_the_ridge_under_its_plan_ceiling(steady: tuple) -> None:
    _, agent, _ = steady
    st = status.status_dict(agent.snapshot)
    roof = st["targets"][0]["roofline"]
    c = agent.snapshot.targets[0].constants
    assert roof["ridge"] == pytest.approx(physics.ridge_point(c.peak_flops, c.peak_bandwidth))
    series = _series(st)
    w = series["windows"][0]
    decode = series["operating"]["decode"]
    assert decode["intensity"] == w["decode_intensity"]
    assert decode["flops"] == pytest.approx(w["mfu"]["decode"] * roof["peak_flops"])
    # decode of a chat batch is memory-bound: far left of the ridge, under the memory roof
    assert decode["intensity"] < roof["ridge"] / 3
    assert decode["flops"] < decode["intensity"] * roof["peak_bandwidth"]
    prefill = series["operating"]["prefill"]
    assert prefill["flops"] == pytest.approx(w["mfu"]["prefill"] * roof["peak_flops"])
    assert prefill["intensity"] > decode["intensity"]  # tens of prompt tokens per step against ~20 sequences
    batch, cap = series["ceilings"]
    assert (batch["kind"], cap["kind"], cap["batch"]) == ("batch", "cap", 256)
    # the plan for the window's own batch and context lands where the decode point's intensity is,
    # on the memory roof; the decode point is under it by about its MBU
    assert batch["intensity"] == pytest.approx(decode["intensity"], rel=0.08)
    assert batch["flops"] == pytest.approx(batch["intensity"] * roof["peak_bandwidth"])
    assert decode["flops"] / batch["flops"] == pytest.approx(w["mbu"], rel=0.12)
    assert cap["intensity"] > batch["intensity"] and cap["tokens_per_second"] > batch["tokens_per_second"]
    # the ceilings are the step model's decode step, the one `rooflight plan` and capacity ask: that batch, each
    # sequence holding the live KV layer-tokens a running sequence holds now, on the copy's roofs
    from rooflight.agent.roofline.step import Decode, Step

    short = agent.snapshot.targets[0].series[0].windows[0]
    context = c.layout.layer_tokens_in(short.mean_live_kv_bytes) / short.mean_running
    for ceiling in (batch, cap):
        cost = c.layout.cost(Step(decode=Decode(ceiling["batch"], context)))
        assert ceiling["step_seconds"] == pytest.approx(cost.seconds(c.roofs))
        assert ceiling["intensity"] == pytest.approx(cost.intensity)


async def test_with_tp_2_the_decode_point_is_its_achieved_flops_on_the_doubled_roofs() -> None:
    """One model copy over two GPUs: the roofs are two H100s' (x2 both), and the decode point is the FLOP/s
    decode achieved (its MFU over both GPUs' peak; about 2 x active params x decode tokens/s, less the input
    embeddings, plus attention: docs/physics.md, Live ratios), so it sits under the doubled memory roof by its
    MBU, not at half that height (one GPU's peak times an MFU that is over two)."""
    async with _demo("steady", 20.0, batch_max=256, tp=2) as (_, agent, _):
        c = agent.snapshot.targets[0].constants
        target = status.status_dict(agent.snapshot)["targets"][0]
    h100 = get_profile("h100-sxm")
    assert c.tensor_parallel_size == 2 and c.gpu.key == h100.key
    roof = target["roofline"]
    assert roof["tensor_parallel_size"] == 2
    assert roof["peak_flops"] == pytest.approx(2 * h100.peak_flops[c.compute_dtype], rel=1e-12)
    assert roof["peak_bandwidth"] == pytest.approx(2 * h100.memory_bandwidth_bytes_per_second, rel=1e-12)
    (series,) = target["series"]
    w = series["windows"][0]
    decode = series["operating"]["decode"]
    assert decode["flops"] == pytest.approx(w["mfu"]["decode"] * roof["peak_flops"], rel=1e-9)  # both GPUs' peak
    by_hand = 2.0 * c.model.params_active * w["tokens_per_second"]["decode"]  # FLOP/s of the weights' matmuls
    assert decode["flops"] == pytest.approx(by_hand, rel=0.10)  # one GPU's peak would read half of it
    assert decode["flops"] < decode["intensity"] * roof["peak_bandwidth"]  # under the doubled memory roof
    assert decode["flops"] / (decode["intensity"] * roof["peak_bandwidth"]) == pytest.approx(w["mbu"], rel=0.12)
    drawn = _points(render_roofline(target))["decode"]
    assert float(drawn.get("data-flops")) == decode["flops"]


@pytest.mark.parametrize("value, state", [(True, "active"), (False, "clear"), (None, "unknown")])
def test_detector_states_and_runbook_links(value: bool | None, state: str) -> None:
    verdicts = Verdicts({d.key: value for d in detectors()}, itl_inflation=4.0 if value else None)
    rows = status.detectors(verdicts)
    assert [r["key"] for r in rows] == [d.key for d in detectors()]  # every detector, in its order
    assert {"head_of_line", "capacity_capped", "engine_stalled"} <= {r["key"] for r in rows}
    assert {r["state"] for r in rows} == {state}
    assert all(r["sentence"].endswith(".") and len(r["sentence"]) > 40 for r in rows)
    headings = {h.strip().lower() for h in re.findall(r"^## (\S+)", (ROOT / "docs" / "runbooks.md").read_text(), re.M)}
    for r in rows:
        base, anchor = r["runbook"].split("#")
        assert base == status.RUNBOOK_BASE_URL and anchor in headings
    assert status.detectors(None)[0]["state"] == "unknown"


def test_runbook_base_is_the_rules_default() -> None:
    from rooflight.rules.config import RulesConfig

    assert status.RUNBOOK_BASE_URL == RulesConfig().runbook_base_url


async def test_the_agent_keeps_the_sparklines_before_anyone_looks(steady: tuple) -> None:
    """A page opened now draws the samples before it was opened: the agent records them as it samples."""
    engine, agent, clock = steady
    app = web.Application()
    page.add_status_routes(app, agent)
    history = app[page.STATUS_HISTORY_KEY]
    await advance(engine, agent, clock, 5.0)
    assert history.series(("x", "y", "z")) == {"t": [], **{f: [] for f in HISTORY_FIELDS}}
    (target,) = agent.snapshot.targets
    key = (target.name, target.series[0].series.model, target.series[0].series.rank)
    cols = history.series(key)  # the agent sampled ten times, nobody asked: all ten are there
    assert len(cols["t"]) >= 8 and cols["t"] == sorted(set(cols["t"]))
    assert cols["mbu"][-1] is not None and cols["running"][-1] is not None
    assert status.status_dict(agent.snapshot, history)["targets"][0]["series"][0]["history"] == cols


async def test_a_sparkline_keeps_its_share_of_points_over_five_minutes(steady: tuple) -> None:
    """Full before it spans five minutes, a ring keeps every other point; past five minutes the oldest go; the
    same sample recorded twice counts once; a series that left takes its ring with it."""
    engine, agent, clock = steady
    (target,) = agent.snapshot.targets
    key = (target.name, target.series[0].series.model, target.series[0].series.rank)
    small = Sparklines(points=4)
    for t in range(40):
        small.record(agent.snapshot.targets[0], float(t), 1)
        small.record(agent.snapshot.targets[0], float(t), 1)
    t_kept = small.series(key)["t"]
    assert len(t_kept) <= 4 and t_kept[-1] == 39.0 and t_kept[0] <= 39.0 - 16  # 40 s in 4 points, evenly thinned
    assert set(small.series(key)) == {"t", *HISTORY_FIELDS}
    for t in range(40, 1000, 10):
        small.record(agent.snapshot.targets[0], float(t), 1)
    t_kept = small.series(key)["t"]
    assert t_kept[-1] == 990.0 and t_kept[0] >= 990.0 - 300  # nothing older than five minutes
    small.record(replace(target, series=()), 1000.0, 1)  # the series left: its ring goes with it
    assert small.series(key)["t"] == []


def test_last_error_is_the_reason_that_grew_and_no_message_is_shown() -> None:
    from rooflight.agent.metrics.snapshot import Health

    secret = "cannot connect to scraper:s3cr3t@10.0.0.1"
    down = Health("engine", "t", False, None, 0.1, {"timeout": 1, "refused": 0}, message=secret)
    history = status.History()
    first = status.status_dict(Snapshot(created=10.0, health=(down,)), history)
    assert first["health"][0]["last_error"] == {"at": None, "reason": "timeout"}  # the only one failing
    worse = replace(down, errors={"timeout": 1, "refused": 2})
    status.status_dict(Snapshot(created=11.0, health=(worse,)), history)
    up = replace(worse, up=True, message=None, last_success=12.0)
    row = status.status_dict(Snapshot(created=13.0, health=(up,)), history)["health"][0]
    assert row["last_error"] == {"at": 11.0, "reason": "refused"}  # kept after the source recovered
    assert row["errors"] == {"refused": 2, "timeout": 1} and row["error_count"] == 3
    import json

    assert "s3cr3t" not in json.dumps(first) and "cannot connect" not in json.dumps(first)
    assert status.status_dict(Snapshot(created=14.0), history)["health"] == []
    assert history.last_error("engine", "t") is None  # a source that left takes its record with it


# -- the chart ---------------------------------------------------------------------------------------

def _points(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {g.get("data-kind"): g for g in root.iter(f"{SVG}g") if g.get("data-kind")}


async def test_roofline_svg_plots_the_status_numbers(steady: tuple) -> None:
    _, agent, _ = steady
    target = status.status_dict(agent.snapshot)["targets"][0]
    svg = render_roofline(target)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg" and "rl-roofline" in root.get("class")
    ridge = next(e for e in root.iter(f"{SVG}line") if e.get("class") == "rl-ridge")
    points = _points(svg)
    assert set(points) == {"decode", "prefill", "ceiling", "cap"}
    op = target["series"][0]["operating"]
    for kind in ("decode", "prefill"):
        assert float(points[kind].get("data-intensity")) == op[kind]["intensity"]
        assert float(points[kind].get("data-flops")) == op[kind]["flops"]
    circle = points["decode"].find(f"{SVG}circle")
    assert float(circle.get("cx")) < float(ridge.get("x1"))  # left of the ridge, as drawn
    # every marker inside the plot area
    for g in points.values():
        shape = next(iter(g))
        xs = [float(v) for v in re.findall(r"-?\d+\.\d", " ".join(shape.get(a, "") for a in ("cx", "x", "d")))]
        assert xs and all(0 <= x <= 720 for x in xs)


def test_roofline_svg_escapes_names_and_says_when_it_has_nothing() -> None:
    evil = "<script>alert(1)</script>&\"'"
    target = {"name": evil, "roofline": None, "series": []}
    svg = render_roofline(target)
    root = ET.fromstring(svg)  # well-formed despite the name
    assert not list(root.iter(f"{SVG}script")) and "<script>" not in svg
    assert "no GPU profile yet" in svg
    assert "no target" in render_roofline(None)
    roof = {"ridge": 295.0, "peak_flops": 989e12, "peak_bandwidth": 3.35e12, "gpu_name": evil,
            "tensor_parallel_size": 1, "compute_dtype": "bf16"}
    svg = render_roofline({"name": evil, "roofline": roof, "series": []})
    assert not list(ET.fromstring(svg).iter(f"{SVG}script")) and "no decode point yet" in svg


# -- the routes --------------------------------------------------------------------------------------

@pytest.fixture
async def client(steady: tuple) -> AsyncIterator[TestClient]:
    _, agent, _ = steady
    app = web.Application()
    page.add_status_routes(app, agent)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_page_is_self_contained(client: TestClient) -> None:
    resp = await client.get("/")
    assert resp.status == 200 and resp.content_type == "text/html"
    html = await resp.text()
    assert "/*STATUS_CSS*/" not in html and "/*STATUS_JS*/" not in html
    assert "prefers-color-scheme: dark" in html and "api/v1/status" in html and "roofline.svg" in html
    # nothing fetched from elsewhere: no external script, stylesheet, font, image or import
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert not re.search(r"""@import|url\(\s*["']?(https?:)?//""", html)
    assert "<script src" not in html and 'rel="stylesheet"' not in html


async def test_status_and_svg_routes(client: TestClient) -> None:
    resp = await client.get("/api/v1/status")
    assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
    st = await resp.json()
    name = st["targets"][0]["name"]
    assert _series(st)["history"]["t"], "a request records the current sample"
    resp = await client.get("/roofline.svg", params={"target": name})
    assert resp.status == 200 and resp.content_type == "image/svg+xml"
    assert set(_points(await resp.text())) >= {"decode", "prefill"}
    assert (await client.get("/roofline.svg")).status == 200
    assert (await client.get("/roofline.svg", params={"target": "nope"})).status == 404
    assert (await client.get("/roofline.svg", params={"target": "x" * 5000})).status == 404


async def test_the_status_and_its_charts_name_the_snapshot_they_were_drawn_from(steady: tuple,
                                                                                client: TestClient) -> None:
    # the page pairs a status with charts of the same snapshot by this header (status.js fetchSnapshot)
    engine, agent, clock = steady
    seen = []
    for _ in range(2):
        status_resp = await client.get("/api/v1/status")
        created = json.dumps((await status_resp.json())["created"])
        chart = await client.get("/roofline.svg")
        assert status_resp.headers[page.SNAPSHOT_HEADER] == chart.headers[page.SNAPSHOT_HEADER] == created
        seen.append(created)
        await advance(engine, agent, clock, 0.5)  # a sample lands: the next pair names the next snapshot
    assert seen[0] != seen[1] and float(seen[1]) > float(seen[0])


async def test_web_config_basic_auth_covers_every_page_route(steady: tuple, tmp_path) -> None:
    import base64

    import bcrypt

    from rooflight.agent.serve import webconfig

    _, agent, _ = steady
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  viewer: '{hashed}'\n")
    app = web.Application(middlewares=[webconfig.WebSecurity(path).middleware])
    page.add_status_routes(app, agent)
    good = {"Authorization": "Basic " + base64.b64encode(b"viewer:s3cret").decode()}
    async with TestClient(TestServer(app)) as c:
        for route in ("/", "/roofline.svg", "/api/v1/status"):
            assert (await c.get(route)).status == 401, route
            assert (await c.get(route, headers=good)).status == 200, route


async def test_a_gpu_no_profile_covers_draws_no_roofs_and_no_ceilings(steady: tuple) -> None:
    _, agent, _ = steady
    snap = agent.snapshot
    target = snap.targets[0]
    unknown = replace(target, constants=replace(target.constants, gpu=None, gpu_note="NVIDIA A10G: no profile"))
    st = status.status_dict(replace(snap, targets=(unknown,)))  # an A10G's target: nothing to divide by
    shown = st["targets"][0]
    assert shown["roofline"] is None
    assert _series(st)["ceilings"] == []


def test_the_head_of_line_row_says_which_itl_judged() -> None:
    engine = Verdicts(head_of_line=False, itl_inflation=1.2, capacity_capped=False, admission_bound=False,
                      at_configured_max=False)
    proxy = engine.replace(head_of_line=True, itl_inflation=12.0, itl_source="proxy")
    assert status.detectors(engine)[0]["itl_source"] == "engine"
    assert status.detectors(proxy)[0] | {"itl_inflation": 12.0, "itl_source": "proxy"} == status.detectors(proxy)[0]
