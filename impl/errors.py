"""What a store call raises when it gives no answer, besides a refusal.

A refusal (`leaseproof.model.errors.Refused`) is an answer: the model's rejection,
nothing written. The errors here are not answers; each tells the caller whether to retry:

- `Unavailable`: the call gave up waiting (for a lock, or past a statement's bound) and
  rolled back; nothing took effect, the connection is usable, and it may be sent again.
- `ConnectionLost`: the connection is gone; `applied` is False when it was lost before
  the COMMIT was sent (nothing took effect), None when it may have taken effect (read
  the state, or resend what specs/delivery.md says is safe). A ConnectionError, so the
  harness records the operation as indeterminate and replaces the session.
- `Forbidden`: the role may not do this at all (a community outside its scope,
  `lp_role_scope`, or a privilege it lacks); nothing took effect, nor will a resend.
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
