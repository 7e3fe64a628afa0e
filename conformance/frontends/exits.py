"""The exit statuses every `leaseproof` command shares, and how its `--help` states them."""

from __future__ import annotations

EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, EXIT_SUBSET = 0, 1, 2, 3
# Exit status of a run ended by Ctrl-C (SIGINT), SIGTERM or SIGHUP, after cleaning up.
EXIT_INTERRUPTED = 130
INTERRUPTED_EXITS = (
    f"{EXIT_INTERRUPTED} interrupted (Ctrl-C, SIGTERM or SIGHUP): scratch databases dropped, "
    "an embedded server stopped and its folder removed"
)
