"""Start a real NVIDIA Dynamo deployment on 127.0.0.1: the OpenAI frontend and mocker workers, one process each.

Owns how the Dynamo checks run Dynamo (ai-dynamo 1.6.1, the venv .ci/dynamo.sh builds):
- discovery on a per-deployment directory (`--discovery-backend file`, DYN_FILE_KV), the TCP request
  plane and the ZMQ event plane, so neither etcd nor NATS is needed (`mem` discovery is per process);
- every DYN_*_HOST on 127.0.0.1, or the request plane binds another interface;
- one process per worker: a process holding two workers shows one worker's metrics;
- HOME in the run dir: the frontend caches model cards under ~/.cache/dynamo.
The mocker (`python -m dynamo.mocker`) is Dynamo's GPU-free worker: a vLLM-style scheduler with a real
KV-block manager and a timing model in place of the GPU; it serves the tiny tokenizer's model.
Processes are stopped by PID by the tests (procs.ManagedProcess).
"""

from __future__ import annotations

from pathlib import Path

from procs import ManagedProcess, free_port

MODEL = "tiny"  # the served model name
READY_TIMEOUT_S = 90.0  # frontend ~2 s, model registered ~3-5 s after the mocker starts, on 2 busy cores

HOSTS = ("DYN_HTTP_HOST", "DYN_SYSTEM_HOST", "DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST",
         "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_HTTP_RPC_HOST")


def system_port() -> int:
    """A free port for DYN_SYSTEM_PORT: Dynamo 1.6.1 parses it as an i16 and the worker exits on anything
    above 32767 (free_port() draws below the kernel's ephemeral range, which starts at 32768 by default)."""
    port = free_port()
    if port > 32767:
        raise RuntimeError(f"free_port() gave {port}, above the i16 Dynamo reads DYN_SYSTEM_PORT as")
    return port


def dynamo_env(store: Path, home: Path) -> dict[str, str]:
    env = {h: "127.0.0.1" for h in HOSTS}
    env.update(DYN_FILE_KV=str(store), HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               DYN_LOG="warn")
    return env


def frontend_process(python: str, run_dir: Path, port: int, router_mode: str = "round-robin") -> ManagedProcess:
    argv = [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
            "--discovery-backend", "file", "--request-plane", "tcp", "--router-mode", router_mode]
    return ManagedProcess(name="dynamo-frontend", argv=argv, log_path=run_dir / f"frontend-{port}.log", port=port,
                          env=dynamo_env(run_dir / "store", run_dir / "home"), tmpdir=run_dir / f"tmp-frontend-{port}",
                          env_drop_prefixes=("ROOFLIGHT_",))


def mocker_process(python: str, model_dir: Path, run_dir: Path, name: str, system_port: int,
                   extra: tuple[str, ...] = ()) -> ManagedProcess:
    """One mocker worker; its /metrics on DYN_SYSTEM_PORT = system_port."""
    argv = [python, "-m", "dynamo.mocker", "--model-path", str(model_dir), "--model-name", MODEL,
            "--discovery-backend", "file", "--request-plane", "tcp", *extra]
    env = dynamo_env(run_dir / "store", run_dir / "home")
    env["DYN_SYSTEM_PORT"] = str(system_port)
    return ManagedProcess(name=f"dynamo-mocker-{name}", argv=argv, log_path=run_dir / f"mocker-{name}-{system_port}.log",
                          port=system_port, env=env, tmpdir=run_dir / f"tmp-mocker-{name}-{system_port}",
                          env_drop_prefixes=("ROOFLIGHT_",))
