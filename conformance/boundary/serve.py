"""The bundled PostgreSQL store as an out-of-process adapter.

    python -m leaseproof.conformance.boundary.serve [--dsn DSN] [--mutant NAME]

Speaks the wire protocol of `specs/adapter-protocol.md` on stdin/stdout;
diagnostics go to stderr. Without --dsn it provisions its own server (the
same order as `leaseproof verify`) and serves both machines, each in a
scratch database of its own, which it drops however it ends: at end of input or
"close", on SIGTERM, SIGHUP or Ctrl-C. One killed outright (SIGKILL) cannot, so
a serve drops the databases of killed ones at its first reset and when it ends
(`_orphaned` says which). Not sooner: a serve started again after a kill is told
to `attach` to its predecessor's delivery database (specs/adapter-protocol.md,
"Restarts"), which it adopts (the database's comment names it) and drops when it
ends.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import socket
import sys

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.boundary.serving import serve, stdout_for_protocol
from leaseproof.conformance.harness.databases import databases_named, drop_database, process_alive, scratch_database
from leaseproof.conformance.harness.interrupts import interruptible
from leaseproof.conformance.harness.provision import postgres_server
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.service import DeliveryService
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS
from leaseproof.impl.mutants.faults import FAULT_MUTANTS, NETWORK_MUTANTS, RESTART_MUTANTS
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant
from leaseproof.impl.mutants.race import RACE_MUTANTS
from leaseproof.impl.mutants.service import SERVICE_MUTANTS

# Every mutant of either machine, sequential, racy (which only concurrent
# sessions show), faulty (which only a cut connection shows), forgetful (which only
# a restart of this process shows), resending (which only an answer lost after a
# commit shows), or one of the service's whose bug is in the store (a sweep that waits
# for a stalled tenant, say); the other machine is served as bundled.
SERVED = (
    *MUTANTS,
    *LIFECYCLE_MUTANTS,
    *RACE_MUTANTS,
    *FAULT_MUTANTS,
    *RESTART_MUTANTS,
    *NETWORK_MUTANTS,
    *(mutant for mutant in SERVICE_MUTANTS if mutant.service is DeliveryService),
)

# Scratch databases are named lp_serve_<host>_<pid>_<parent pid>_<random>, so a
# later serve on the same host can tell whose owner is gone, and who started it.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_PREFIX = "lp_serve"


_ADOPTED = f"adopted by serve {_HOST} "  # a database's comment, then the adopter's pid


def _gone(pid: str) -> bool:
    return pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid))


def _orphaned(name: str, comment: str) -> bool:
    """Whether a scratch database of this host's serves is no one's: its maker is gone,
    no running serve adopted it, and no harness but this process's own may still start
    a serve to attach to it (the maker's parent is gone, or is this serve's parent,
    which is ending or resetting this serve, so not restarting another)."""
    parts = name.split("_")
    maker, parent = parts[3], parts[4] if len(parts) == 6 else ""
    adopter = comment.removeprefix(_ADOPTED) if comment.startswith(_ADOPTED) else ""
    return (
        _gone(maker)
        and (not adopter or _gone(adopter))
        and (not parent or parent == str(os.getppid()) or _gone(parent))
    )


def _drop_orphans(server: Server) -> None:
    """Drop the scratch databases of this host's serve processes that are no one's."""
    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute("SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database").fetchall()
    comments: dict[str, str | None] = dict(rows)
    for name in databases_named(server, f"{_PREFIX}_{_HOST}"):
        if _orphaned(name, comments.get(name) or ""):
            maker = name.split("_")[3]
            print(f"serve: dropping {name}, left by serve process {maker}, which is gone", file=sys.stderr)
            drop_database(server, name)


def _drop_orphans_at_end(server: Server) -> None:
    try:
        _drop_orphans(server)
    except psycopg.Error as exc:  # its own are dropped by then; the next serve tries again
        print(f"serve: could not drop what killed serve processes left: {exc}", file=sys.stderr)


def _adopt(server: Server, dsn: str) -> str:
    """Mark the database of `dsn`, made by a serve that was killed, as this process's; its name."""
    name = str(conninfo_to_dict(dsn).get("dbname") or "")
    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
        comment = sql.SQL("COMMENT ON DATABASE {} IS {}").format(
            sql.Identifier(name), sql.Literal(f"{_ADOPTED}{os.getpid()}")
        )
        conn.execute(comment)
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leaseproof.conformance.boundary.serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--dsn", help="server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument("--mutant", choices=[mu.name for mu in SERVED], help="serve a known-buggy variant")
    args = parser.parse_args(argv)
    protocol = stdout_for_protocol()
    mutant = by_name(SERVED, args.mutant) if args.mutant else None
    # Through every `with`, as Ctrl-C does. SIGINT too: a child started from a
    # background job inherits it ignored, and Python then leaves it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interruptible(), contextlib.ExitStack() as stack:
            server = stack.enter_context(postgres_server(args.dsn, log=lambda line: print(line, file=sys.stderr)))
            stack.callback(_drop_orphans_at_end, server)  # last: what killed predecessors left
            # One scratch database per machine, so each reset is its machine's alone.
            mine = f"{_PREFIX}_{_HOST}_{os.getpid()}_{os.getppid()}"
            delivery_dsn, lifecycle_dsn = (stack.enter_context(scratch_database(server, prefix=mine)) for _ in "dl")

            def delivery_adapter(dsn: str) -> PostgresDeliveryAdapter:
                adapter = (
                    mutant.adapter(dsn)
                    if mutant is not None and not isinstance(mutant, LifecycleMutant)
                    else PostgresDeliveryAdapter(dsn, PostgresDeliveryStore)
                )
                stack.callback(adapter.close)
                return adapter

            def attach_delivery(dsn: str) -> PostgresDeliveryAdapter:
                adopted = _adopt(server, dsn)
                stack.callback(drop_database, server, adopted)  # after the adapter closes
                return delivery_adapter(dsn)

            delivery = delivery_adapter(delivery_dsn)
            lifecycle = (
                mutant.adapter(lifecycle_dsn)
                if isinstance(mutant, LifecycleMutant)
                else PostgresLifecycleAdapter(lifecycle_dsn)
            )
            stack.callback(lifecycle.close)
            name = f"leaseproof bundled {delivery.name} / {lifecycle.name}"
            orphans_dropped = False

            def drop_orphans_once() -> None:  # at the first reset (the module's docstring says why)
                nonlocal orphans_dropped
                if not orphans_dropped:
                    orphans_dropped = True
                    _drop_orphans(server)

            serve(
                delivery,
                implementation=name,
                lifecycle=lifecycle,
                stdout=protocol,
                attach={"delivery": attach_delivery},
                before_reset=drop_orphans_once,
            )
    except KeyboardInterrupt:
        print("serve: ended by a signal; its scratch databases are dropped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
