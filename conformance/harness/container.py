"""A throwaway `postgres:16-alpine` container, the second way `postgres_server()` tries:
`docker_engine()` asks whether a Docker engine answers (through the docker package, else
a bare HTTP ping), and `container_server()` starts the container with testcontainers, an
optional extra (leaseproof[docker]), and stops it when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator

from psycopg.conninfo import make_conninfo

from leaseproof.conformance.harness.server import STARTUP_DEADLINE, Log, Server, SourceUnavailable, try_version

__all__ = ["CONTAINER_IMAGE", "container_server", "docker_engine"]

CONTAINER_IMAGE = "postgres:16-alpine"

_DOCKER_PROBE_TIMEOUT = 2.0


def docker_engine(timeout: float = _DOCKER_PROBE_TIMEOUT) -> tuple[bool, str]:
    """(answered, detail): does a Docker engine answer a ping within `timeout`?

    detail names the endpoint that answered, or why none did. Tests replace
    `provision.docker_engine`, the name `postgres_server()` calls, to force the embedded path.
    """
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        import docker
    except ImportError:
        return _raw_docker_ping(host, timeout)
    try:
        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - the docker package raises many unrelated types
        return False, f"no Docker engine answered at {host} ({_first_line(exc)})"
    return True, f"Docker engine at {host}"


def _raw_docker_ping(host: str, timeout: float) -> tuple[bool, str]:
    # Without the docker package, speak just enough HTTP to call /_ping.
    try:
        if host.startswith("unix://"):
            path = host[len("unix://") :]
            if not os.path.exists(path):
                return False, f"no Docker socket at {path}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                raise
        elif host.startswith("tcp://"):
            hostport = host[len("tcp://") :].split("/", 1)[0]
            name, _, port = hostport.rpartition(":")
            sock = socket.create_connection((name, int(port or 2375)), timeout=timeout)
        else:
            return False, f"cannot probe DOCKER_HOST={host} without the docker package"
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = sock.recv(64)
    except (OSError, ValueError) as exc:
        return False, f"no Docker engine answered at {host} ({exc})"
    if re.match(rb"HTTP/1\.[01] 200", reply):
        return True, f"Docker engine at {host}"
    return False, f"{host} did not answer a Docker ping ({reply[:30]!r})"


@contextlib.contextmanager
def container_server(engine: str, say: Log) -> Iterator[Server]:
    try:
        # Optional extra: absent unless leaseproof[docker] is installed.
        from testcontainers.postgres import PostgresContainer
    except ImportError as exc:
        raise SourceUnavailable(f"{engine} answered but testcontainers is not installed ({exc})") from exc
    say(f"starting {CONTAINER_IMAGE} with testcontainers ({engine})")
    container = PostgresContainer(CONTAINER_IMAGE)
    try:
        container.start()
    except Exception as exc:  # pulls and starts fail in many ways; all mean "not usable"
        with contextlib.suppress(Exception):
            container.stop()
        raise SourceUnavailable(f"starting {CONTAINER_IMAGE} failed ({_first_line(exc)})") from exc
    try:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(5432)
        dsn = make_conninfo(
            host=host,
            port=str(port),
            user=container.username,
            password=container.password,
            dbname="postgres",
        )
        version = _wait_until_answers(dsn, deadline=time.monotonic() + STARTUP_DEADLINE)
        if version is None:
            raise SourceUnavailable(f"{CONTAINER_IMAGE} at {host}:{port} never accepted connections")
        say(f"PostgreSQL {version} container ready at {host}:{port}")
        yield Server(
            dsn=dsn,
            source="testcontainers",
            description=f"PostgreSQL {version} in a {CONTAINER_IMAGE} container at {host}:{port}",
        )
    finally:
        say(f"stopping the {CONTAINER_IMAGE} container")
        with contextlib.suppress(Exception):
            container.stop()


def _wait_until_answers(dsn: str, *, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        version = try_version(dsn)
        if version is not None:
            return version
        time.sleep(0.25)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
