"""What a store call raises when it gives no answer, besides a refusal.

A refusal (`leaseproof.model.errors.Refused`) is an answer: the model's
rejection, nothing written. The two errors here are not answers, and they
tell the caller what it needs to decide whether to retry:

- `Unavailable`: the call gave up waiting (for a lock another client holds,
  for a statement that ran past its bound) and its transaction rolled back.
  It did not take effect, the connection is still usable, and the call may
  be sent again.
- `ConnectionLost`: the connection is gone. `applied` says what is known:
  False when it was lost before the COMMIT was sent (the server rolls the
  transaction back: nothing took effect), None when it was lost while
  committing (it may or may not have taken effect: read the state, or send
  again an operation whose retry is safe; specs/delivery.md says which).
  It is a ConnectionError, so the conformance harness records the operation
  as indeterminate and replaces the session.
- `Forbidden`: the calling role may not do this at all: it acts for other
  communities only (impl/migrations/0006_database_api.sql, `lp_role_scope`), or
  lacks the privilege (the reaper's sweep is the reaper role's). Nothing took
  effect; sending it again changes nothing.
"""

from __future__ import annotations


class Unavailable(Exception):
    """Gave up waiting; rolled back; nothing took effect; may be retried."""

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"{operation}: {reason}; it did not take effect and may be retried")
        self.operation, self.reason = operation, reason


class ConnectionLost(ConnectionError):
    """The connection is gone; `applied` is False (nothing took effect) or None (unknown)."""

    def __init__(self, operation: str, applied: bool | None, cause: BaseException) -> None:
        when = (
            "while it was committing: it may or may not have taken effect"
            if applied is None
            else ("before it committed: it did not take effect")
        )
        super().__init__(f"{operation}: the connection was lost {when} ({type(cause).__name__}: {cause})")
        self.operation, self.applied = operation, applied


class Forbidden(PermissionError):
    """The calling role may not do this (its scope, or a privilege it lacks); nothing took effect."""

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"{operation}: the role may not do this ({reason}); it did not take effect")
        self.operation, self.reason = operation, reason
