"""Run the embedded API server as a child process (what ``railyard local up`` and tests use)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .kubeconfig import write_kubeconfig


@dataclass
class ServerProcess:
    url: str
    token: str
    ca_file: Path | None
    state_dir: Path
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def write_kubeconfig(self, path: Path | str) -> Path:
        return write_kubeconfig(path, self.url, self.token, ca_file=self.ca_file)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM and wait (the server commits and closes cleanly); SIGKILL after ``timeout_s``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_server_process(state_dir: Path | str, *, token: str | None = None, port: int = 0,
                         extra_args: list[str] | None = None, log_file: Path | str | None = None,
                         timeout_s: float = 30.0) -> ServerProcess:
    """Start ``python -m railyard_local.apiserver`` and wait until it serves."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    token = token or secrets.token_hex(16)
    ready = state / f"ready-{os.getpid()}-{time.monotonic_ns()}.json"
    log = Path(log_file) if log_file else state / "apiserver.log"
    token_file = state / "token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    cmd = [sys.executable, "-m", "railyard_local.apiserver", "--state-dir", str(state), "--port", str(port),
           "--token-file", str(token_file), "--ready-file", str(ready), *(extra_args or [])]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"apiserver exited with {proc.returncode}; see {log}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"apiserver not ready after {timeout_s} s; see {log}")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    ready.unlink()
    return ServerProcess(info["url"], token, Path(info["ca"]) if info.get("ca") else None, state, proc)
