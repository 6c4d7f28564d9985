"""The status page in a real browser (Debian's Chromium, headless, driven by Playwright) against
`rooflight demo` run as a user runs it, in its own process:

- steady: the page loads without console errors or failed requests; the roofline shows the decode point
  left of the ridge (as drawn, not only as data); every number the page shows that /metrics also exports
  equals /metrics for the same engine sample; it fits a phone's width in dark mode; when the agent goes
  away the page says so.
- sparklines: a page opened after the agent has sampled a while draws those samples at once.
- head-of-line: the head-of-line detector shows as active within a few seconds of a long prompt's stall
  (the stall is read from the simulated engine's own prompt-token counter, polled alongside the page),
  and never before one.

One screenshot per scenario goes to an artifact folder (ROOFLIGHT_ARTIFACTS, else a temporary folder; the
path is printed). ROOFLIGHT_UPDATE_SCREENSHOT=1 also rewrites docs/img/status-page.png, the README's.
Skipped only where no Chromium binary exists and CI is not set; in CI a missing browser fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.demo.scenarios import LONG_PROMPT_TOKENS
from demo_procs import start_demo, start_rooflight, stop_process
from support import ROOT, free_port

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
README_SHOT = ROOT / "docs" / "img" / "status-page.png"
README_SHOT_MAX_BYTES = 200_000
# One xdist worker runs this file (.ci/test: --dist loadgroup): one Chromium (the module's), one page at a time.
pytestmark = pytest.mark.xdist_group("browser")
# Bounds with room for a loaded 2-core machine (about 2x what each chain takes there at worst, as the
# project's tests hold), yet each still says what it proves:
# - the page shows what /metrics did within one page poll (1 s) and its render, plus the test's own loop
#   (three HTTP reads and a page evaluation, 0.25 s apart, which a loaded machine stretches past a second);
#   a page that stopped polling never shows it, and its poll cadence is tested alone (_same_moment, 5 s);
# - the page shows the stall within half the 20 s between long prompts: this stall, never the next one
#   (agent samples every 1 s, the page polls every 1 s, the test every 0.25 s; ~2-3 s when quiet).
PAGE_BEHIND_METRICS_SECONDS = 5.0
STALL_TO_PAGE_SECONDS = 10.0


def _chromium() -> str | None:
    found = os.environ.get("ROOFLIGHT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return found or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = _chromium()
    if exe is None and not os.environ.get("CI"):
        pytest.skip("no Chromium binary on this machine (Debian: apt-get install chromium; .ci/install does)")
    assert exe is not None, "CI is set but no Chromium binary was found: .ci/install should install Debian's chromium"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    path = Path(os.environ.get("ROOFLIGHT_ARTIFACTS") or tempfile.mkdtemp(prefix="rooflight-status-page-"))
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nstatus page screenshots: {path}")
    return path


# -- the demo, in its own process --------------------------------------------------------------------

def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


class Demo:
    def __init__(self, scenario: str) -> None:
        self.port, self.engine_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.engine_url = f"http://127.0.0.1:{self.engine_port}/metrics"
        self.proc = start_demo(scenario, f"127.0.0.1:{self.port}", f"127.0.0.1:{self.engine_port}")
        self.started = time.monotonic()
        deadline = self.started + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"rooflight demo exited: {self.stop()}"
            try:
                _get(self.url + "-/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"rooflight demo not ready after 30 s: {self.stop()}")

    def stop(self) -> str:
        return stop_process(self.proc)


@pytest.fixture
def demo(request: pytest.FixtureRequest) -> Iterator[Demo]:
    d = Demo(request.param)
    yield d
    d.stop()


# -- the page ----------------------------------------------------------------------------------------

class Console:
    """Everything the page said it got wrong: console errors and warnings, script errors, failed requests."""

    def __init__(self, page: Any) -> None:
        self.problems: list[str] = []
        page.on("console", lambda m: m.type in ("error", "warning") and self.problems.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url} {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))


def _open(browser: Any, url: str, *, width: int = 1280, scheme: str = "light") -> tuple[Any, Any, Console]:
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    page = context.new_page()
    console = Console(page)
    page.goto(url)
    assert page.title().startswith(("Rooflight", "(")), page.title()
    assert page.locator("#targets").count() == 1, "/ is not the status page (is add_status_routes wired?)"
    return context, page, console


def _wait_until(page: Any, expression: str, seconds: float) -> None:
    """Poll `expression` with page.evaluate: wait_for_function compiles its predicate with eval in the page,
    which the page's Content-Security-Policy (no 'unsafe-eval') refuses."""
    deadline = time.monotonic() + seconds
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true within {seconds} s: {expression}"
        page.wait_for_timeout(50)


def _wait_for_decode_point(page: Any, seconds: float = 40.0) -> None:
    page.wait_for_selector("figure.roofline g.rl-point-decode", timeout=seconds * 1000)


READ_NUMBERS = """() => Array.from(document.querySelectorAll('[data-metric]')).map(e => ({
  name: e.dataset.metric, labels: JSON.parse(e.dataset.labels),
  value: e.dataset.value === undefined ? null : Number(e.dataset.value), text: e.textContent}))"""


def _metrics(url: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(_get(url + "metrics")):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _sources(numbers: list[dict]) -> dict[str, float]:
    return {n["labels"]["source"] + "/" + n["labels"]["target"]: n["value"] for n in numbers
            if n["name"] == "rooflight_source_last_success_timestamp_seconds"}


def _same_moment(page: Any, url: str, attempts: int = 30) -> tuple[list[dict], dict]:
    """The page's numbers and /metrics from the same snapshot: every source's last success agrees.

    The page is paused right after it renders a new snapshot and /metrics read at once; a source that
    sampled in between shows as a different last-success time, and the pair is taken again.
    """
    if page.get_attribute("#pause", "aria-pressed") != "true":
        page.click("#pause")
    for attempt in range(1, attempts + 1):
        before = page.get_attribute("body", "data-created")
        page.click("#pause")  # resume
        _wait_until(page, f"document.body.dataset.created !== {json.dumps(before)}", seconds=5)
        page.click("#pause")  # pause on the fresh render
        metrics = _metrics(url)
        numbers = page.evaluate(READ_NUMBERS)
        shown = _sources(numbers)
        exported = {f"{dict(k[1])['source']}/{dict(k[1])['target']}": v for k, v in metrics.items()
                    if k[0] == "rooflight_source_last_success_timestamp_seconds"}
        if shown and shown == exported:
            print(f"page and /metrics from one snapshot on attempt {attempt}")
            return numbers, metrics
    raise AssertionError(f"no page render matched /metrics in {attempts} attempts")


def _no_horizontal_scroll(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    viewport = page.evaluate("window.innerWidth")
    assert width <= viewport + 1, f"page is {width}px wide in a {viewport}px viewport"


def _charts_are_of_the_status_snapshot(page: Any) -> None:
    """A chart of another snapshot than the status (a sample landed between the page's fetches) is not drawn
    beside it: the first chart served is made to name a stale snapshot, and the page must ask again."""
    served: list[str] = []

    def stale_once(route: Any) -> None:
        response = route.fetch()
        headers = {**response.headers, **({} if served else {"x-rooflight-snapshot": "0"})}  # a stale snapshot
        served.append(route.request.url)
        route.fulfill(response=response, headers=headers)

    before = page.get_attribute("body", "data-created")
    page.route("**/roofline.svg*", stale_once)
    try:
        deadline = time.monotonic() + 15
        while not (len(served) >= 2 and page.get_attribute("body", "data-created") != before):
            assert time.monotonic() < deadline, f"no render after a stale chart; charts served: {served}"
            page.wait_for_timeout(50)
        shown = page.evaluate("[document.body.dataset.created, document.querySelector('figure.roofline').dataset.snapshot]")
    finally:
        page.unroute("**/roofline.svg*")
    # the stale chart was asked again, not drawn (a sample landing in both later fetches too, rare, draws the
    # third as it is: of a real snapshot, so this holds whatever the machine's load)
    assert shown[1] not in (None, "0"), f"status of {shown[0]}, chart of {shown[1]}"


@pytest.mark.parametrize("demo", ["steady"], indirect=True)
def test_steady_roofline_and_numbers_match_metrics(browser: Any, demo: Demo, artifacts: Path) -> None:
    context, page, console = _open(browser, demo.url)
    try:
        _wait_for_decode_point(page)
        # the decode point is drawn left of the ridge, and its data says why
        decode = page.locator("figure.roofline g.rl-point-decode")
        ridge = page.locator("figure.roofline line.rl-ridge")
        d_box, r_box = decode.bounding_box(), ridge.bounding_box()
        assert d_box["x"] + d_box["width"] < r_box["x"], (d_box, r_box)
        intensity = float(decode.get_attribute("data-intensity"))
        assert intensity < float(ridge.get_attribute("data-intensity"))
        assert "left of the ridge: memory-bound" in page.inner_text("figure.roofline figcaption")

        numbers, metrics = _same_moment(page, demo.url)
        shown = {n["name"] for n in numbers}
        for name in ("rooflight_mbu_ratio", "rooflight_mfu_ratio", "rooflight_tokens_per_second",
                     "rooflight_ttft_seconds", "rooflight_itl_seconds", "rooflight_kv_cache_usage_ratio",
                     "rooflight_requests_running", "rooflight_requests_waiting", "rooflight_batch_max_requests",
                     "rooflight_decode_arithmetic_intensity_flops_per_byte", "rooflight_head_of_line_blocking",
                     "rooflight_source_up"):
            assert name in shown, f"the page shows no {name}"
        compared = 0
        for n in numbers:
            key = (n["name"], frozenset(n["labels"].items()))
            if n["value"] is None:
                assert key not in metrics, f"page shows no value for {key}, /metrics has {metrics.get(key)}"
                continue
            assert key in metrics, f"page shows {n['name']}{n['labels']} = {n['value']}, /metrics does not"
            assert n["value"] == pytest.approx(metrics[key], rel=1e-12, abs=1e-12), key
            compared += 1
            if n["text"].endswith("%"):  # and the text says the same number, rounded to its decimals
                decimals = len(n["text"][:-1].partition(".")[2])
                assert float(n["text"][:-1]) == pytest.approx(100 * n["value"], abs=0.5 * 10**-decimals + 1e-9)
        assert compared >= 25, f"only {compared} numbers compared"
        print(f"{compared} numbers on the page equal /metrics")
        mbu = next(n for n in numbers if n["name"] == "rooflight_mbu_ratio")
        assert 0.05 < mbu["value"] < 1.0  # a live number, not a placeholder

        page.click("#pause")  # resume, so the shots show a live page
        _charts_are_of_the_status_snapshot(page)
        page.wait_for_timeout(1200)
        shot = artifacts / "steady-1280-light.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        # a phone, in dark mode: nothing wider than the screen, the chart scaled to fit
        page.set_viewport_size({"width": 390, "height": 844})
        page.emulate_media(color_scheme="dark")
        page.wait_for_timeout(1200)
        _no_horizontal_scroll(page)
        chart = page.locator("figure.roofline svg").bounding_box()
        assert chart["width"] <= 390
        bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert bg != "rgb(247, 247, 245)", "dark mode did not change the background"
        page.screenshot(path=str(artifacts / "steady-390-dark.png"), full_page=True)
        assert console.problems == []
        # the agent goes away: the page says so and keeps the last numbers, greyed out
        demo.stop()
        page.wait_for_selector("#banner:not([hidden])", timeout=10_000)
        assert "did not answer" in page.inner_text("#banner")
        assert "stale" in page.get_attribute("body", "class") and page.locator("g.rl-point-decode").count() == 1
    finally:
        context.close()


HEAD_OF_LINE = """() => {
  const li = document.querySelector('li.detector[data-detector=head_of_line]');
  const factor = li && li.querySelector('[data-metric=rooflight_itl_tail_inflation]');
  return [li ? li.dataset.state : null, factor ? Number(factor.dataset.value) : null];
}"""


def _hol_reading(exposition: str) -> str:
    """The detector's flag and its inflation as /metrics shows them, one line."""
    names = ("rooflight_head_of_line_blocking", "rooflight_itl_tail_inflation")
    found = {n: re.findall(rf"^{n}(?:\{{[^}}]*\}})? (\S+)$", exposition, re.M) for n in names}
    return " ".join(f"{n.removeprefix('rooflight_')}={','.join(v) or '-'}" for n, v in found.items())


def _prompt_tokens(engine_url: str) -> float:
    m = re.search(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$", _get(engine_url), re.M)
    assert m, "the demo engine exports no vllm:prompt_tokens_total"
    return float(m.group(1))


@pytest.mark.parametrize("demo", ["steady"], indirect=True)
def test_sparklines_open_with_the_samples_taken_before_the_page(browser: Any, demo: Demo) -> None:
    """The agent keeps the last five minutes itself: a page opened after 8 s of sampling (1 s apart) draws
    them at once, not one point that grows while the page stays open."""
    time.sleep(max(0.0, 8.0 - (time.monotonic() - demo.started)))
    context, page, console = _open(browser, demo.url)
    try:
        page.wait_for_selector(".spark[data-points]", timeout=20_000)
        points = page.evaluate("() => Array.from(document.querySelectorAll('.spark')).map(e => Number(e.dataset.points))")
        assert points and min(points) >= 5, points
        assert not console.problems, console.problems
    finally:
        context.close()


@pytest.mark.parametrize("demo", ["head-of-line"], indirect=True)
def test_head_of_line_shows_active_within_seconds_of_the_stall(browser: Any, demo: Demo, artifacts: Path) -> None:
    context, page, console = _open(browser, demo.url)
    try:
        page.wait_for_selector("li.detector[data-detector=head_of_line]", timeout=30_000)
        stalls: list[float] = []
        previous = _prompt_tokens(demo.engine_url)
        active_at = exported_at = None
        flipped_by: list[float] = []
        trail: list[str] = []  # what /metrics said at each turn, for the failure message
        deadline = time.monotonic() + 90  # long prompts every 20 s; the detector's baseline needs 30 s
        while time.monotonic() < deadline and active_at is None:
            time.sleep(0.25)
            now = time.monotonic()
            tokens = _prompt_tokens(demo.engine_url)
            if tokens - previous >= LONG_PROMPT_TOKENS:
                stalls.append(now)
            previous = tokens
            exposition = _get(demo.url + "metrics")
            stalled = " STALL" if stalls and stalls[-1] == now else ""
            trail.append(f"{now - demo.started:.1f}s {_hol_reading(exposition)}{stalled}")
            if exported_at is None and re.search(r"^rooflight_head_of_line_blocking\{[^}]*\} 1\.0$", exposition, re.M):
                exported_at = now
                # the sample that flipped the detector: the stall's size as the agent judged it
                flipped_by = [float(v) for v in re.findall(
                    r"^rooflight_itl_tail_inflation\{[^}]*\} (\S+)$", exposition, re.M)]
            state, inflation = page.evaluate(HEAD_OF_LINE)
            if state == "active":
                active_at = now
        assert stalls, "no long prompt was seen in the engine's counters"
        assert active_at is not None, (f"head-of-line never showed as active on the page (/metrics: "
                                       f"{'flipped' if exported_at else 'never flipped'}); what /metrics said:\n"
                                       + "\n".join(trail))
        lag = active_at - max(s for s in stalls if s <= active_at)
        assert 0 <= lag <= STALL_TO_PAGE_SECONDS, f"active {lag:.1f}s after the last stall"
        # the page follows the agent: at most one poll (1 s) and a render behind /metrics
        behind = active_at - (exported_at if exported_at is not None else active_at)
        assert behind <= PAGE_BEHIND_METRICS_SECONDS, f"the page showed it {behind:.1f}s after /metrics did"
        print(f"head-of-line active on the page {lag:.2f}s after the stall, {behind:.2f}s after /metrics "
              f"(stalls at {', '.join(f'{s - demo.started:.1f}' for s in stalls)} s)")
        badge = page.locator("li.detector[data-detector=head_of_line] .state")
        assert badge.inner_text() == "ACTIVE" and badge.get_attribute("data-value") == "1"
        row = page.locator("li.detector[data-detector=head_of_line]").inner_text()
        assert "(the engine's ITL buckets)" in row, row  # the demo has no proxy in front: its buckets judged
        # the detector flipped on a stall of at least the 3x threshold (the agent's own number in that sample);
        # the page shows the factor beside it (the render may come a sample after the stall, on a busy machine,
        # when the factor has fallen back: its value is not compared)
        assert exported_at is not None and max(flipped_by) >= 3.0 * (1 - 1e-9), flipped_by
        assert inflation is not None and inflation > 0, inflation
        if os.environ.get("ROOFLIGHT_UPDATE_SCREENSHOT") == "1":  # while the stall's size is still shown
            README_SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(README_SHOT), clip={"x": 0, "y": 0, "width": 1280, "height": 900})
        assert page.title().startswith("(1) Rooflight: Head-of-line blocking")
        shot = artifacts / "head-of-line-1280-light.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        assert console.problems == []
    finally:
        context.close()


SOURCE_STATE = """(source) => {
  const s = document.querySelector(`tr[data-source=${source}] .state`);
  return s ? [s.className, s.textContent, s.dataset.metric, s.dataset.value] : null;
}"""


def test_an_engine_still_loading_shows_starting_not_down(browser: Any) -> None:
    """A pod whose engine is loading its model: the agent has not had one good sample since it started, and
    the page says starting (as rooflight_source_starting does), not the DOWN a crashed engine gets."""
    listen, loading = f"127.0.0.1:{free_port()}", free_port()  # nothing listens on `loading`: refused
    agent = start_rooflight("run", "--engine-url", f"http://127.0.0.1:{loading}", "--model", "llama-3-8b",
                            "--no-nvml", "--no-process", "--listen", listen, "--interval", "0.5",
                            "--log-level", "warning")
    url = f"http://{listen}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert agent.poll() is None, f"rooflight run exited: {stop_process(agent)}"
            try:
                _get(url + "-/ready", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, "rooflight run not ready after 30 s"
                time.sleep(0.2)
        context, page, console = _open(browser, url)
        try:
            _wait_until(page, "() => !!document.querySelector('tr[data-source=engine] .state')", 20)
            cls, text, metric, value = page.evaluate(SOURCE_STATE, "engine")
            assert (cls, text, metric, value) == ("state starting", "starting", "rooflight_source_starting", "1")
            metrics = _metrics(url)
            key = ("rooflight_source_starting", frozenset({("source", "engine"), ("target", f"127.0.0.1:{loading}")}))
            assert metrics[key] == 1.0 and metrics[("rooflight_source_up", key[1])] == 0.0
            assert page.evaluate(SOURCE_STATE, "process") is None  # --no-process: no row
            assert console.problems == []
        finally:
            context.close()
    finally:
        stop_process(agent)


def test_readme_screenshot_is_committed_and_small() -> None:
    data = README_SHOT.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) < README_SHOT_MAX_BYTES, f"{README_SHOT} is {len(data)} bytes; keep it under 200 KB"
