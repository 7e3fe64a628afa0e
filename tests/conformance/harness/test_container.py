"""The Docker engine probe (container.py), and the way on to the embedded server when an
engine answers but testcontainers is not installed."""

from __future__ import annotations

import importlib.util
import shutil
import socketserver
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseproof.conformance.harness import container, embedded, provision
from leaseproof.conformance.harness.provision import postgres_server


class _PingHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while self.rfile.readline().strip():
            pass  # skip the request line and headers
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")


@pytest.fixture
def fake_docker_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A unix socket that answers Docker's /_ping, exported as DOCKER_HOST."""
    folder = Path(tempfile.mkdtemp(prefix="lp-dock-"))  # short: sun_path is small
    path = folder / "docker.sock"
    server = socketserver.ThreadingUnixStreamServer(str(path), _PingHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        yield f"unix://{path}"
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(folder)


def test_docker_engine_is_absent_when_nothing_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/leaseproof/docker.sock")
    started = time.monotonic()
    answered, detail = container.docker_engine()
    assert time.monotonic() - started < 2.5
    assert not answered
    assert "/nonexistent/leaseproof/docker.sock" in detail


def test_docker_engine_answers_on_a_ping(fake_docker_engine: str) -> None:
    assert container.docker_engine() == (True, f"Docker engine at {fake_docker_engine}")


@pytest.mark.skipif(
    importlib.util.find_spec("testcontainers") is not None,
    reason="testcontainers is installed; this checks the fallback without it",
)
def test_docker_without_testcontainers_falls_back_to_embedded(
    fake_docker_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(provision.DSN_ENV, raising=False)
    monkeypatch.delenv(embedded.PG_BIN_ENV, raising=False)
    messages: list[str] = []
    with postgres_server(log=messages.append) as server:
        assert server.source == "embedded"
    assert any("testcontainers is not installed" in m for m in messages), messages
