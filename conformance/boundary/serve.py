"""The bundled PostgreSQL store as an out-of-process adapter.

    python -m leaseproof.conformance.boundary.serve [--dsn DSN] [--mutant NAME]

Speaks the wire protocol of `specs/adapter-protocol.md` on stdin/stdout;
diagnostics go to stderr. Without --dsn it provisions its own server (the
same order as `leaseproof verify`) and works in a scratch database.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from leaseproof.conformance.boundary.wire import serve, stdout_for_protocol
from leaseproof.conformance.harness.provision import postgres_server, scratch_database
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leaseproof.conformance.boundary.serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--dsn", help="server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument("--mutant", choices=[mu.name for mu in MUTANTS], help="serve a known-buggy variant")
    args = parser.parse_args(argv)
    protocol = stdout_for_protocol()
    store = by_name(MUTANTS, args.mutant).store if args.mutant else PostgresDeliveryStore
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(postgres_server(args.dsn, log=lambda line: print(line, file=sys.stderr)))
        dsn = stack.enter_context(scratch_database(server))
        adapter = PostgresDeliveryAdapter(dsn, store)
        stack.callback(adapter.close)
        serve(adapter, implementation=f"leaseproof bundled {adapter.name}", stdout=protocol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
