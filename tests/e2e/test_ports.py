"""The harness's ports (tests/ports.py): never from the range outgoing connections take theirs from, never
the same for two test processes running at once, never handed out twice in a row."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

import ports
from support import TESTS

HOLDER = """
import sys
sys.path.insert(0, sys.argv[1])
import ports
print(*(ports.free_port() for _ in range(50)), flush=True)
sys.stdin.read()  # holds its slice until the test closes stdin
"""


def test_a_port_is_below_the_ephemeral_range_and_free() -> None:
    port = ports.free_port()
    assert ports.FLOOR <= port < ports._ephemeral_floor()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing listens on it


def test_a_process_does_not_hand_out_a_port_again_soon() -> None:
    drawn = [ports.free_port() for _ in range(ports.SLICE // 2)]
    assert len(set(drawn)) == len(drawn)


def test_a_listening_port_is_never_handed_out() -> None:
    held = []
    try:
        for _ in range(20):
            s = socket.socket()
            s.bind(("127.0.0.1", ports.free_port()))
            s.listen()
            held.append(s)
        bound = {s.getsockname()[1] for s in held}
        assert not bound & {ports.free_port() for _ in range(ports.SLICE // 2)}
    finally:
        for s in held:
            s.close()


def test_two_processes_at_once_draw_from_disjoint_slices() -> None:
    ours = {ports.free_port() for _ in range(50)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(TESTS)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        theirs = {int(p) for p in holder.stdout.readline().split()}
    finally:
        holder.communicate("", timeout=30)
    assert len(theirs) == 50
    assert ports._slice is not None
    mine = ports._slice[0]
    assert all(p in mine for p in ours)
    assert not any(p in mine for p in theirs), "the other process drew from this process's slice"


def test_with_no_slice_free_it_says_so_and_lets_the_kernel_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_slice", None)
    monkeypatch.setattr(ports, "_claim_slice", lambda: None)
    with pytest.warns(UserWarning, match="no port slice free"):
        port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
