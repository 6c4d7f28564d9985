"""`rooflight plan --from-live` against a hostile agent, over real sockets on 127.0.0.1.

A server that drips one byte every half second must not hold the command past its deadline (the timeout
was per read); escape sequences in a label are shown, not sent to the terminal; a 15.5 MB page costs
what its signal lines cost, not five times the page.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from typing import Callable

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.plan_cli import fetch_live
from support import ROOT

GOOD = ('# TYPE rooflight_tokens_per_second gauge\n'
        'rooflight_tokens_per_second{target="%s",engine="vllm",model="m",rank="0",window="1m",phase="decode"} 1200\n'
        'rooflight_requests_per_second{target="%s",engine="vllm",model="m",rank="0",window="1m"} 4\n')


def _server(answer: Callable[[socket.socket], None]) -> tuple[socket.socket, int]:
    """A raw TCP server on 127.0.0.1 that runs `answer` on each connection (in a thread) after reading the request."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            def one(c: socket.socket = conn) -> None:
                try:
                    c.recv(65536)
                    answer(c)
                except OSError:
                    pass
                finally:
                    c.close()
            threading.Thread(target=one, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def _drip(head: bytes) -> Callable[[socket.socket], None]:
    def answer(c: socket.socket) -> None:
        c.sendall(head)
        for _ in range(200):  # 100 s of one byte every half second
            c.sendall(b"#")
            time.sleep(0.5)
    return answer


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",  # a dripping body
                                  b"HTTP/1.1 200 OK\r\nX-Slow: "])  # dripping headers
def test_a_drip_cannot_hold_the_fetch_past_its_deadline(head: bytes) -> None:
    listener, port = _server(_drip(head))
    outcome: list[object] = []

    def fetch() -> None:
        try:
            fetch_live(f"http://127.0.0.1:{port}/", timeout=2.0)
            outcome.append("returned")
        except ConfigError as exc:
            outcome.append(exc)

    start = time.monotonic()
    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(20)
    took = time.monotonic() - start
    listener.close()
    assert outcome, "still reading after 20 s (before: a drip kept it going for as long as it dripped)"
    assert isinstance(outcome[0], ConfigError) and "within 2 s" in str(outcome[0]), outcome
    assert took < 2 * 2.0 + 2, took


def _page_answer(body: bytes) -> Callable[[socket.socket], None]:
    def answer(c: socket.socket) -> None:
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                  % len(body) + body)
    return answer


def test_escape_sequences_in_labels_never_reach_the_terminal() -> None:
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mtarget\r\nforged line"
    evil_label = evil.replace("\n", "\\n")  # a line break inside a label value is written \n
    listener, port = _server(_page_answer((GOOD % (evil_label, evil_label)).encode()))
    try:
        result = subprocess.run([sys.executable, "-m", "rooflight", "plan", "--from-live", f"http://127.0.0.1:{port}/"],
                                capture_output=True, text=True, timeout=60, cwd=ROOT)
    finally:
        listener.close()
    assert result.returncode == 0, result.stderr
    assert "1,200 decode tok/s" in result.stdout, result.stdout
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\r" not in result.stdout
    assert "\\x1b" in result.stdout and "forged line" in result.stdout
    assert not any(line.startswith("forged line") for line in result.stdout.splitlines())


def test_a_big_page_costs_its_signal_lines_not_the_page() -> None:
    filler = b"".join(b'f{a="%07d",b="c"} 1\n' % i for i in range(700_000))  # ~15.4 MB of small samples
    body = filler + (GOOD % ("t", "t")).encode()
    assert 15 * 2**20 < len(body) < 16 * 2**20
    listener, port = _server(_page_answer(body))
    # VmHWM, the peak RSS of this process image (ru_maxrss would count the forked pytest's before exec)
    measure = ("import re, sys; from rooflight.agent.cli import main; code = main(sys.argv[1:]);"
               " print('peak', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1),"
               " file=sys.stderr); sys.exit(code)")
    try:
        result = subprocess.run([sys.executable, "-c", measure, "plan", "--from-live", f"http://127.0.0.1:{port}/"],
                                capture_output=True, text=True, timeout=120, cwd=ROOT)
        baseline = subprocess.run([sys.executable, "-c", measure, "plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"],
                                  capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        listener.close()
    assert result.returncode == 0 and baseline.returncode == 0, result.stderr + baseline.stderr
    assert "window 1m" in result.stdout
    peak_kb = int(result.stderr.split("peak ")[-1])
    base_kb = int(baseline.stderr.split("peak ")[-1])
    # the page streams past and only its signal lines are kept
    # measured: 77 MiB over `plan` without --from-live before, 1 MiB now
    assert peak_kb - base_kb < 30 * 1024, (peak_kb, base_kb)


def test_a_window_the_agent_does_not_serve_is_named_without_the_pages_escape_sequences() -> None:
    """`--window 1m` against a page whose only window label is an escape sequence (retitle the terminal, ring
    the bell): the error lists the windows the page serves, shown, not sent."""
    from rooflight.agent.plan_cli import live_series

    page = GOOD.replace('window="1m"', 'window="\x1b]0;pwned\x07"') % ("t", "t")
    with pytest.raises(ConfigError) as caught:
        live_series(page, "1m")
    message = str(caught.value)
    assert "\x1b" not in message and "\x07" not in message, repr(message)
    assert "\\x1b]0;pwned\\x07" in message, message
