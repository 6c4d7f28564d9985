"""Broken configuration stops the start with exit 2 and what to fix, never a traceback.

Covers a config file of the wrong shape or encoding, YAML alias bombs and oversized files, durations
and sizes that are not finite, a bad ROOFLIGHT_LOG_LEVEL, a --listen the agent cannot bind, an engine
URL whose password would spill into the host or path (percent-encode it), and YAML syntax errors that
must not echo the offending line. Through cli.main in this process, or the real `rooflight` command.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rooflight.agent import cli
from rooflight.agent.errors import ConfigError
from rooflight.agent.config import agent as cfg
from rooflight.agent.config import urls, yamlfile
from support import ROOT, free_port

RUN = ["run", "--engine-url", "http://127.0.0.1:9", "--no-nvml", "--no-process"]


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().err


def _file(tmp_path: Path, text: str | bytes, name: str = "rooflight.yml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _rooflight(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "rooflight", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=full_env)


# -- settings of the wrong shape ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("detectors: [hol_inflation, 4]\n", "detectors: write a mapping"),
        ("detectors: hol_inflation=4\n", "detectors: write a mapping"),
        ("detectors:\n  hol_inflation: high\n", "detectors.hol_inflation: 'high' is not a number"),
        ("detectors:\n  hol_inflation: .inf\n", "is not a number"),
        ("web_config: 5\n", "web_config: 5 is not a file path"),
        ("web_config: [a.yml]\n", "is not a file path"),
        ("max_body_bytes: .inf\n", "max_body_bytes: inf is not a whole number"),
        ("max_body_bytes: 1.5\n", "not a whole number"),
        ("max_series: true\n", "not a whole number"),
        ("scrape_timeout: .inf\n", "scrape_timeout: inf is not a finite duration"),
        ("scrape_timeout: .nan\n", "not a finite duration"),
        ("scrape_timeout: 1h\n", "choose at most 300s"),
        ("nvml_interval: 1.0e+400\n", "nvml_interval: inf is not a finite duration"),
        ("read_header_timeout: 0\n", "must be more than zero"),
        ("max_connections: 0\n", "max_connections: must be at least 1"),
        ("listen: 127.0.0.1:65536\n", "listen address '127.0.0.1:65536': write HOST:PORT"),  # one past the last port
        ("gpu_hour_cost: 0\n", "gpu_hour_cost: must be above 0"),  # a free GPU-hour: every token would cost 0
        ("nvml_interval: 25h\n", "nvml_interval: '25h' is longer than a day"),
        ("tp: 0\n", "tp: must be at least 1"),  # a model copy spans at least one GPU
    ],
)
def test_a_setting_of_the_wrong_shape_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              text: str, says: str) -> None:
    code, err = _main(capsys, *RUN, "--config", _file(tmp_path, text), "--check-only")
    assert code == 2, err
    assert says in err


def test_the_new_limits_are_settings_with_defaults(tmp_path: Path) -> None:
    config = cfg.build({}, {}, {"engine_url": ["http://127.0.0.1:9"]})
    assert (config.read_header_timeout, config.max_connections) == (10.0, 256)
    config = cfg.build({"read_header_timeout": "2s"}, {"max_connections": "8"}, {"engine_url": ["http://127.0.0.1:9"]})
    assert (config.read_header_timeout, config.max_connections) == (2.0, 8)


# -- the file itself ----------------------------------------------------------------------------------------
def test_a_directory_as_config_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(capsys, *RUN, "--config", "/", "--check-only")
    assert code == 2 and "is a directory" in err


def test_a_config_that_is_not_utf8_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(capsys, *RUN, "--config", _file(tmp_path, b"model: \xff\xfe llama\n"), "--check-only")
    assert code == 2 and "not UTF-8" in err


def test_a_config_over_the_size_cap_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "model: llama-3-8b\n" + "# padding\n" * (yamlfile.MAX_CONFIG_BYTES // 10 + 1)
    code, err = _main(capsys, *RUN, "--config", _file(tmp_path, text), "--check-only")
    assert code == 2 and "larger than 1024 KiB" in err


def _laughs(key: str, levels: int, fan: int, leaf: str = "lol") -> str:
    """A 'billion laughs': each level lists the previous one `fan` times, by alias."""
    lines = [f"l0: &l0 [{leaf}]"]
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * fan) + "]")
    lines.append(f"{key}: *l{levels}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (_laughs("model", 9, 9), "more than 32 YAML aliases"),
        # under the alias budget, but 4**7 copies of a 100 kB string: the expanded size is what is refused
        (_laughs("listen", 7, 4, leaf="x" * 100_000), "expand to more than"),
        (_laughs("interval", 15, 2), "expand to more than"),
        ("model: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested too deeply"),
        ("windows: [" + ", ".join(["1s"] * 30_000) + "]\n", "more than 20000 YAML values"),
    ],
)
def test_yaml_bombs_are_refused_quickly(tmp_path: Path, text: str, says: str) -> None:
    result = _rooflight(*RUN, "--config", _file(tmp_path, text), "--check-only", timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert says in result.stderr and "Traceback" not in result.stderr


def test_aliases_within_the_budget_still_work(tmp_path: Path) -> None:
    text = ("common: &common {model: llama-3-8b, gpu: h100-sxm}\n"
            "targets:\n  - {url: 'http://127.0.0.1:9', name: a, model: llama-3-8b}\n")
    data = cfg.load_file(_file(tmp_path, text))
    assert data["common"] == {"model": "llama-3-8b", "gpu": "h100-sxm"}


def test_a_yaml_syntax_error_reports_the_line_not_its_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "listen: 127.0.0.1:9746\nengine_url: http://scraper:s3cr3t-token@127.0.0.1:8000: [oops\n"
    code, err = _main(capsys, "run", "--config", _file(tmp_path, text), "--check-only")
    assert code == 2
    assert "not valid YAML at line 2" in err
    assert "s3cr3t" not in err and "scraper" not in err


def test_a_bad_log_level_in_the_environment_exits_2() -> None:
    result = _rooflight(*RUN, "--check-only", env={"ROOFLIGHT_LOG_LEVEL": "basic_format"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "ROOFLIGHT_LOG_LEVEL" in result.stderr and "debug, info, warning, error" in result.stderr
    assert "Traceback" not in result.stderr
    assert _rooflight(*RUN, "--check-only", env={"ROOFLIGHT_LOG_LEVEL": "WARNING"}).returncode == 0


# -- --listen ------------------------------------------------------------------------------------------------
def test_listen_on_a_port_in_use_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _main(capsys, *RUN, "--listen", f"127.0.0.1:{port}")
    assert code == 2 and "already in use" in err


def test_listen_on_an_address_not_on_this_machine_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(capsys, *RUN, "--listen", "192.0.2.1:9746")  # TEST-NET-1: on no machine
    assert code == 2 and "not an address of this machine" in err


def _privileged_port_is_refused_here() -> bool:
    try:
        start = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        start = 1024
    return os.geteuid() != 0 and start > 80


def test_listen_on_a_privileged_port_exits_2(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if not _privileged_port_is_refused_here():
        # root (or a lowered ip_unprivileged_port_start) may bind port 80: give the refusal everyone else gets
        async def refuse(*args: object, **kwargs: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(asyncio.BaseEventLoop, "create_server", refuse)
    code, err = _main(capsys, *RUN, "--listen", "127.0.0.1:80")
    assert code == 2 and "choose a port of 1024 or more" in err


def test_demo_engine_listen_in_use_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _main(capsys, "demo", "--engine-listen", f"127.0.0.1:{port}", "--listen",
                          f"127.0.0.1:{free_port()}", "--duration", "1")
    assert code == 2 and "--engine-listen" in err and "already in use" in err


# -- engine URLs with credentials -------------------------------------------------------------------------
@pytest.mark.parametrize("url", [
    "http://admin:Top/secret@127.0.0.1:8000",
    "http://admin:Top?secret@127.0.0.1:8000",
    "http://admin:Top#secret@127.0.0.1:8000",
])
def test_an_unescaped_password_in_an_engine_url_is_refused(capsys: pytest.CaptureFixture[str], url: str) -> None:
    code, err = _main(capsys, "run", "--engine-url", url, "--no-nvml", "--no-process", "--check-only")
    assert code == 2, err
    assert "percent-encode" in err and "%2F" in err
    assert "secret" not in err.replace("percent", "") and "Top" not in err


def test_an_unescaped_password_in_a_targets_list_is_refused(tmp_path: Path) -> None:
    text = "targets:\n  - url: 'http://admin:Top/secret@127.0.0.1:8000'\n    model: llama-3-8b\n"
    with pytest.raises(ConfigError, match="percent-encode") as caught:
        cfg.build(cfg.load_file(_file(tmp_path, text)), {}, {})
    assert "Top" not in str(caught.value)


@pytest.mark.parametrize(("url", "name"), [
    ("http://admin:Top%2Fsecret@127.0.0.1:8000", "127.0.0.1:8000"),
    ("http://admin:p@ss@127.0.0.1:8000", "127.0.0.1:8000"),
    ("https://user:pw@[::1]:8443/v1", "[::1]:8443"),
    ("http://engine.local", "engine.local"),
])
def test_a_target_name_never_holds_the_userinfo(url: str, name: str) -> None:
    target = cfg.build({}, {}, {"engine_url": [url]}).targets[0]
    assert target.name == name
    assert "pw" not in urls.public_url(url) and "Top" not in urls.public_url(url)


@pytest.mark.parametrize(("entry", "says"), [
    ({"url": "ftp://admin:s3cr3t@host:21"}, "http://HOST:PORT"),
    ({"url": "http://admin:s3cr3t@host:99999"}, "not a number 0-65535"),
    ({"url": "http://admin:s3cr3t@127.0.0.1:8000", "bogus": 1}, "unknown key"),
    ({"url": "http://admin:s3cr3t@127.0.0.1:8000", "engine": "ollama"}, "is not one of"),
])
def test_errors_about_an_engine_url_never_show_its_password(entry: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        cfg.build({"targets": [entry]}, {}, {})
    assert "s3cr3t" not in str(caught.value)


def test_a_date_yaml_cannot_hold_is_a_config_error(tmp_path: Path) -> None:
    from rooflight.agent.config.agent import load_file

    bad = tmp_path / "rooflight.yaml"
    bad.write_text("model: 2001-02-30\n")  # YAML reads a date; Python's date refuses February 30
    with pytest.raises(ConfigError, match="quote it"):
        load_file(str(bad))


# -- inputs that must not end in tracebacks (exit 1) where exit 2 and what to fix belong ------------------------
@pytest.mark.parametrize("args", [
    RUN[:1] + ["--engine-url", "http://[::1", "--check-only"],
    RUN[:1] + ["--engine-url", "http://u:p@[::1:8000/", "--check-only"],
    ["proxy", "--upstream", "http://[::1", "--listen", "127.0.0.1:0"],
    RUN + ["--proxy-listen", "127.0.0.1:0", "--proxy-upstream", "http://[::1", "--check-only"],
])
def test_an_unclosed_ipv6_bracket_exits_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, err = _main(capsys, *args)
    assert code == 2 and "IPv6 address goes in brackets" in err, err
    assert "p@" not in err  # a password is never echoed


def test_an_unclosed_ipv6_bracket_in_the_environment_exits_2(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFLIGHT_ENGINE_URL", "http://[::1")
    code, err = _main(capsys, "run", "--check-only")
    assert code == 2 and "IPv6 address goes in brackets" in err, err


@pytest.mark.parametrize("text", [
    "1: 2\n",
    "engine_url: http://127.0.0.1:9\non: 1\n",
    "targets:\n  - {url: 'http://127.0.0.1:9', 3: 4}\n",
    "engine_url: http://127.0.0.1:9\nslo: {2024-01-01: 1}\n",
])
def test_a_key_that_is_not_text_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    code, err = _main(capsys, "run", "--config", _file(tmp_path, text), "--check-only")
    assert code == 2 and "is not a setting name" in err, err


@pytest.mark.parametrize(("text", "says"), [
    ("engine_url: http://127.0.0.1:9\ntp: 2\ntp: 4\n", "line 3: the key 'tp' is given twice (first at line 2)"),
    ("targets:\n  - {url: 'http://127.0.0.1:9', name: a, name: b}\n", "the key 'name' is given twice"),
    ("engine_url: http://127.0.0.1:9\nslo:\n  ttft: 1\n  'ttft': 2\n", "the key 'ttft' is given twice"),
    ("engine_url: http://127.0.0.1:9\nu: {<<: {x: 1, x: 2}}\n", "the key 'x' is given twice"),  # inside a merge
    ("engine_url: http://127.0.0.1:9\non: 1\nyes: 2\n", "the key 'yes' is given twice (first at line 2, as 'on')"),
    ("a: &a {x: 1}\nb: &b {y: 1}\nc: {<<: *a, <<: *b}\n", "`<<` is given twice"),
    ("engine_url: http://127.0.0.1:9\ntp: 1_0\n", "line 2: the number '1_0' is read by YAML as 10"),
    ("engine_url: http://127.0.0.1:9\ntp: 010\n", "the number '010' is read by YAML as 8"),
    ("engine_url: http://127.0.0.1:9\nscrape_timeout: 1:30\n", "the number '1:30' is read by YAML as 90"),
    ("engine_url: http://127.0.0.1:9\ndetectors: {hol_inflation: 1_0.5}\n", "the number '1_0.5'"),
])
def test_a_key_given_twice_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                             says: str) -> None:
    # PyYAML keeps the last silently: a config with `tp: 2` above `tp: 4` ran at TP 4 without a word
    code, err = _main(capsys, "run", "--config", _file(tmp_path, text), "--check-only")
    assert code == 2 and says in err, err


def test_a_merged_key_may_be_overridden(tmp_path: Path) -> None:
    data = cfg.load_file(_file(tmp_path, "base: &b {model: llama-3-8b, gpu: h100-sxm}\nuse:\n  <<: *b\n  gpu: a100\n"))
    assert data["use"] == {"model": "llama-3-8b", "gpu": "a100"}
    # an anchored mapping that overrides a merged key, merged again elsewhere: PyYAML rewrites the first mapping
    # as it merges it, and a check made then saw the override as a key given twice
    text = "base: &x {model: m, tp: 1}\na: {b: {z: &z {<<: *x, tp: 2}}}\nw: {<<: *z}\n"
    assert cfg.load_file(_file(tmp_path, text))["w"] == {"model": "m", "tp": 2}
    assert cfg.load_file(_file(tmp_path, "c: {<<: [{x: 1}, {y: 2}], x: 3}\nh: 0x10\n")) == {"c": {"x": 3, "y": 2}, "h": 16}


@pytest.mark.parametrize("env", [{"ROOFLIGHT_TP": "1_0"}, {"ROOFLIGHT_MAX_SERIES": "1_000"},
                                 {"ROOFLIGHT_GPU_HOUR_COST": "2_5"}, {"ROOFLIGHT_TP": "\uff11\uff10"}])
def test_a_number_with_an_underscore_is_refused(env: dict[str, str]) -> None:
    # int("1_0") is 10 in Python: a TP of 10 from a typo
    result = _rooflight(*RUN, "--check-only", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert repr(next(iter(env.values()))) in result.stderr


@pytest.mark.parametrize("argv", [["run", *RUN[1:], "--tp", "1_0"], ["run", *RUN[1:], "--batch-max", "1_6"],
                                  ["run", *RUN[1:], "--gpu-hour-cost", "2_5"], ["plan", "--model", "llama-3-8b", "--tp", "1_0"],
                                  ["rules", "--slo-min-requests", "1_0"]])
def test_a_flag_with_an_underscore_is_refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--check-only"] if argv[0] == "run" else argv)
    assert exit_.value.code == 2 and "invalid" in capsys.readouterr().err


def test_a_detector_setting_with_an_underscore_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(capsys, *RUN, "--detector", "hol_inflation=1_0", "--check-only")
    assert code == 2 and "write KEY=NUMBER" in err, err


def test_plan_from_live_on_a_page_that_is_not_prometheus_text_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's spelling)
            body = b'rooflight_headroom_ratio{window="1m",resource="kv"} lots\n'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        code, err = _main(capsys, "plan", "--from-live", f"http://127.0.0.1:{httpd.server_address[1]}/")
    finally:
        httpd.shutdown()
    assert code == 2 and "not a Prometheus text page" in err, err


def test_a_target_name_with_control_characters_is_refused_with_a_clear_error(tmp_path) -> None:
    """A target's name is a label value and is printed in every log line about it: an escape sequence in it
    would reach the operator's terminal. It is refused at start (exit 2), shown escaped."""
    import subprocess
    from support import rooflight_exe

    config = tmp_path / "rooflight.yaml"
    config.write_text('targets:\n  - url: http://127.0.0.1:8000\n    name: "evil\\u001b[2Jname"\n')
    run = subprocess.run([rooflight_exe(), "run", "--config", str(config), "--check-only"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "printable" in run.stderr and "\x1b" not in run.stderr and "\\x1b" in run.stderr


def test_a_misspelt_key_is_answered_with_the_one_meant() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting\(s\): intervall; did you mean interval\?"):
        cfg.build({"intervall": "1s", "engine_url": ["http://127.0.0.1:8000"]}, {}, {})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) modle; did you mean model\?; a target takes .*model_config"):
        cfg.build({"targets": [{"url": "http://127.0.0.1:8000", "modle": "llama-3-8b"}]}, {}, {})
    with pytest.raises(ConfigError) as far:  # nothing close: no guess
        cfg.build({"zzzz": 1, "engine_url": ["http://127.0.0.1:8000"]}, {}, {})
    assert "did you mean" not in str(far.value)


def test_the_edges_of_the_proxys_counts_and_percentiles() -> None:
    """Each range is inclusive where its help says so: --tenant-top 0 names no tenant (all are `other`),
    --max-connections 1 is one connection; percentiles are strictly between 0 and 100."""
    from rooflight.agent.config import values as v

    assert (v.label_count(0, "--tenant-top"), v.label_count(1000, "--tenant-top")) == (0, 1000)
    assert (v.connection_cap(1, "--max-connections"), v.connection_cap(10 ** 6, "--max-connections")) == (1, 10 ** 6)
    for bad, check in ((-1, v.label_count), (1001, v.label_count), (0, v.connection_cap), (10 ** 6 + 1, v.connection_cap)):
        with pytest.raises(ConfigError, match="must be between"):
            check(bad, "--flag")
    assert v.parse_percentiles("0.1,99.9") == ("0.1", "99.9")
    for bad in ("0", "100", "50,0"):
        with pytest.raises(ConfigError, match="between 0 and 100"):
            v.parse_percentiles(bad)
    assert v.split_listen("[::1]:65535") == ("::1", 65535)
    assert (v.parse_duration("24h", "--x"), v.gpu_hour_cost(0.01)) == (86400.0, 0.01)  # a day is the longest
    # ROOFLIGHT_NVML=off and friends: each common spelling of a switch, either way
    assert [v.parse_bool(s, "nvml") for s in ("1", "true", "Yes", "on", "0", "false", "no", "OFF")] == [True] * 4 + [False] * 4
    with pytest.raises(ConfigError, match="not true or false"):
        v.parse_bool("disabled", "nvml")


def test_no_nvml_and_no_process_turn_them_off_and_only_when_given() -> None:
    """`--no-nvml` / `--no-process` (the flags of settings whose default is on) store False; absent, the file or
    the environment decides, else the default (on)."""
    import argparse

    from rooflight.agent.config import settings

    parser = argparse.ArgumentParser()
    settings.add_flags(parser, settings.RUN)
    given = settings.flag_values(parser.parse_args(["--engine-url", "http://127.0.0.1:9", "--no-nvml", "--no-process"]),
                                 settings.RUN)
    assert (given["nvml"], given["process"]) == (False, False)
    config = cfg.build({"nvml": True}, {}, {k: given[k] for k in ("engine_url", "nvml", "process")})
    assert (config.nvml, config.process) == (False, False)  # the flag wins over the file
    absent = settings.flag_values(parser.parse_args(["--engine-url", "http://127.0.0.1:9"]), settings.RUN)
    assert "nvml" not in absent and "process" not in absent
    config = cfg.build({"nvml": False}, {}, {"engine_url": absent["engine_url"]})
    assert (config.nvml, config.process) == (False, True)
