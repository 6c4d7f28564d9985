"""Ports for the servers a test starts on 127.0.0.1: one home for every stage (fast, notifications, fleet,
real engine).

A port picked by binding port 0 comes from the kernel's ephemeral range, the range it also takes the local
end of every outgoing connection from; in the seconds between the pick and the server's bind, a
Prometheus scrape or an agent's canary could take it (CI: an agent found its port "already in use"). So
ports are drawn below that range, where no connect() lands. Each test process holds a slice of it (an
flock on a slice file, released by the kernel when the process exits), so two pytest processes or xdist
workers running at once never draw the same port, and a process does not hand the same port out again
until it has handed out half its slice since."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from collections import deque
from pathlib import Path
from typing import IO

FLOOR = 10_000  # below this sit the well-known services (Prometheus 9090, Alertmanager 9093, ...)
SLICE = 1_000  # ports a process draws from: the most any stage's process starts servers on is ~200

_slice: tuple[range, IO[str]] | None = None
_handed_out: deque[int] = deque(maxlen=SLICE // 2)  # the latest, maybe not yet bound by their servers


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _claim_slice() -> tuple[range, IO[str]] | None:
    """The first slice no other live process holds; None when every slice is held."""
    top = _ephemeral_floor()
    lock_dir = Path(tempfile.gettempdir()) / "rooflight-test-ports"
    lock_dir.mkdir(exist_ok=True)
    for start in range(FLOOR, top - SLICE + 1, SLICE):
        lock = open(lock_dir / f"{start}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        return range(start, start + SLICE), lock
    return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, that no outgoing connection will take, and
    that no other test process is handed."""
    global _slice
    if _slice is None:
        _slice = _claim_slice()
    if _slice is None:  # every slice held: fall back to the kernel's pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    ports, _ = _slice
    recent = set(_handed_out)
    candidates = [p for p in ports if p not in recent]
    random.shuffle(candidates)
    for port in candidates:
        _handed_out.append(port)
        if _bindable(port):
            return port
    raise OSError(f"no free port in {ports.start}-{ports.stop - 1} on 127.0.0.1 (pid {os.getpid()})")
