"""Ports for the servers a test starts on 127.0.0.1: one home for every stage (fast, notifications, fleet,
real engine).

A port picked by binding port 0 comes from the kernel's ephemeral range, the range it also takes the local
end of every outgoing connection from; in the seconds between the pick and the server's bind, a
Prometheus scrape or an agent's canary could take it (CI: an agent found its port "already in use"). So
ports are drawn below that range, where no connect() lands. Each test process holds a slice of it by
binding an abstract Unix socket named after the slice (no file, no permission to get wrong; the kernel
frees it when the process exits; its namespace is the network namespace, where ports collide), so two
pytest processes or xdist workers running at once draw from different slices, and a process does not hand
the same port out again until it has handed out half its slice since. Where no slice is free, or the
ephemeral range starts too low to leave one, it warns and falls back to the kernel's pick."""

from __future__ import annotations

import os
import random
import socket
import threading
import warnings
from collections import deque
from pathlib import Path

FLOOR = 10_000  # below this sit the well-known services (Prometheus 9090, Alertmanager 9093, ...)
SLICE = 1_000  # ports a process draws from: the most any stage's process starts servers on is ~200

_slice: tuple[range, socket.socket] | None = None
_lock = threading.Lock()
_handed_out: deque[int] = deque(maxlen=SLICE // 2)  # the latest, maybe not yet bound by their servers


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _claim_slice() -> tuple[range, socket.socket] | None:
    """The first slice no other live process holds; None when every slice is held."""
    for start in range(FLOOR, _ephemeral_floor() - SLICE + 1, SLICE):
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            holder.bind(f"\0rooflight-test-ports-{start}")
        except OSError:
            holder.close()
            continue
        return range(start, start + SLICE), holder
    return None


def _forget_slice() -> None:  # a forked child claims its own, not its parent's
    global _slice
    _slice = None
    _handed_out.clear()


os.register_at_fork(after_in_child=_forget_slice)


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
    with _lock:
        if _slice is None:
            _slice = _claim_slice()
        if _slice is None:
            warnings.warn(f"no port slice free below the ephemeral range ({_ephemeral_floor()}): the kernel picks "
                          "the port, which an outgoing connection may take before the server binds it")
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
