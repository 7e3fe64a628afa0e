"""Choosing a server (provision.py): a named server is used as it is, never replaced, and
fails at once when it does not answer; when nothing can be had, the error names every
source tried and the ways out."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from leaseproof.conformance.harness import embedded, provision
from leaseproof.conformance.harness.provision import ProvisioningError, postgres_server
from leaseproof.conformance.harness.server import Server


def _no_docker(timeout: float = 2.0) -> tuple[bool, str]:
    return False, "disabled by the test"


def test_a_named_server_cannot_be_restarted(pg_server: Server) -> None:
    with postgres_server(pg_server.dsn) as named:
        assert named.restart is None


def _must_not_be_tried(*args: object, **kwargs: object) -> object:
    raise AssertionError("a named DSN must not fall through to other sources")


@pytest.mark.parametrize("via", ["env", "argument"])
def test_unreachable_dsn_fails_fast_naming_source_and_fix(via: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = "host=127.0.0.1 port=1 user=postgres password=hunter2 dbname=postgres"
    monkeypatch.setattr(provision, "docker_engine", _must_not_be_tried)
    monkeypatch.setattr(provision, "embedded_server", _must_not_be_tried)
    if via == "env":
        monkeypatch.setenv(provision.DSN_ENV, dsn)
        argument = None
    else:
        monkeypatch.delenv(provision.DSN_ENV, raising=False)
        argument = dsn

    started = time.monotonic()
    with pytest.raises(ProvisioningError) as info, postgres_server(argument):
        pytest.fail("an unreachable DSN was yielded")
    assert time.monotonic() - started < 6

    message = str(info.value)
    assert ("LEASEPROOF_DSN" if via == "env" else "--dsn") in message
    assert "port=1" in message
    assert "hunter2" not in message, "the password leaked into the message"
    assert "unset LEASEPROOF_DSN" in message and "start that server" in message
    assert "\n" not in message


def test_broken_pg_bin_without_docker_names_every_source_tried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(provision.DSN_ENV, raising=False)
    monkeypatch.setenv(embedded.PG_BIN_ENV, str(tmp_path))
    monkeypatch.setattr(provision, "docker_engine", _no_docker)
    with pytest.raises(ProvisioningError) as info, postgres_server():
        pytest.fail("a server was yielded from an empty bin directory")

    message = str(info.value)
    assert "\n" not in message
    assert "LEASEPROOF_DSN/--dsn: not set" in message
    assert "Docker (testcontainers): disabled by the test" in message
    assert f"LEASEPROOF_PG_BIN={tmp_path}" in message
    assert "no executable initdb" in message
    # ... and the ways out.
    assert "pip install 'leaseproof[docker]'" in message
    assert "set LEASEPROOF_DSN" in message
    assert [source for source, _ in info.value.attempts] == [
        "LEASEPROOF_DSN/--dsn",
        "Docker (testcontainers)",
        f"PostgreSQL from LEASEPROOF_PG_BIN={tmp_path}",
    ]
