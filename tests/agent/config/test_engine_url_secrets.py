"""An engine URL's secrets stay out of every message, and a URL the agent would fetch wrongly stops the start.

A `?token=` or a `#fragment` is as secret as a user:password: no error about an engine URL shows any of them,
whichever way the URL came (--engine-url, ROOFLIGHT_ENGINE_URL, a config file's `targets:`). And an engine URL
with a query passes no check: the agent appends the metrics path to the URL, so `http://h:8000/?token=abc`
would be fetched as `/?token=abc/metrics`, an engine never recognised (exit 2, with what to write instead).
Through cli.main in this process (the command's own entry point).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rooflight.agent import cli

SECRETS = ("s3cret", "pa55w0rd", "x9fr4g")


@pytest.mark.parametrize("url", [
    "http://u:pa55w0rd@127.0.0.1:99999/?token=s3cret#x9fr4g",  # a bad port
    "http://u:pa55w0rd@[::1/?token=s3cret#x9fr4g",  # not a URL
    "ftp://u:pa55w0rd@127.0.0.1/?token=s3cret#x9fr4g",  # not http
    "http://u:pa55w0rd@127.0.0.1:8000/?token=s3cret#x9fr4g",  # otherwise good: the query itself
])
@pytest.mark.parametrize("way", ["flag", "env", "file"])
def test_no_message_about_an_engine_url_shows_its_query_fragment_or_password(
        url: str, way: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--check-only", "--no-nvml", "--no-process"]
    if way == "flag":
        args += ["--engine-url", url]
    elif way == "env":
        monkeypatch.setenv("ROOFLIGHT_ENGINE_URL", url)
    else:
        (tmp_path / "r.yml").write_text(f"targets:\n  - url: '{url}'\n")
        args += ["--config", str(tmp_path / "r.yml")]
    code = cli.main(args)
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "engine URL" in err, err
    assert not any(secret in err + out for secret in SECRETS), err


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/?token=abc", "http://127.0.0.1:8000#x", "http://127.0.0.1:8000/v1?"])
def test_an_engine_url_with_a_query_or_fragment_stops_the_start_saying_what_to_write(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "--check-only", "--no-nvml", "--no-process", "--engine-url", url])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "without ?query or #fragment" in err and "abc" not in err, err
