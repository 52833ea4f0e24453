"""The one exception hierarchy of dispatch-controller.

Every failure that crosses a module boundary is one of these. Third-party errors
(subprocess, asyncssh, SQLAlchemy) are mapped once, at the boundary that sees
them, with ``raise ... from exc``. Retry semantics live in the type: a
``TransientError`` may be retried after ``retry_after`` seconds; everything else
is permanent for the input that caused it.
"""

from __future__ import annotations


class DispatchError(Exception):
    """Base of every error this project raises on purpose."""


class ErrInvalid(DispatchError):
    """The input is wrong; retrying it unchanged cannot succeed.

    ``field`` names the offending field with a dotted path (``resources.nodes``)
    when there is one, so a client can point at it.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)
        self.reason = message


class ErrUnsupported(DispatchError):
    """The request is well formed but this adapter or cluster cannot do it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)
        self.reason = message


class ErrNotFound(DispatchError):
    """The object does not exist, or failed the identity check (never acted on)."""


class ErrConflict(DispatchError):
    """The object is in a state that forbids the operation now; re-observe, do not fail."""


class ProtocolError(DispatchError):
    """Slurm printed something the parser cannot accept (malformed or unknown shape).

    Carries no sentinel meaning: the caller must not act on the data that caused it.
    """


class TransientError(DispatchError):
    """A retryable failure: unreachable host, slurmctld down, timeout, dropped connection.

    When raised by a write, the outcome is *unknown*: the caller must re-observe
    (rediscover) before trying again.
    """

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ErrBackPressure(TransientError):
    """Slurm refused a submission for a limit that frees itself (``MaxSubmitJobs``,
    ``QOSMaxSubmitJobPerUserLimit``, ...): nothing was created; keep the intent's job,
    back off and submit again when room appears. Never a job failure."""


class LeaseLost(DispatchError):
    """This process no longer holds the leader lease (or it is too close to expiry to
    act): it must make no write to Slurm or the database until it holds a lease again."""


class OwnershipConflict(DispatchError):
    """Another database that carries this deployment's id acts on the same cluster (a
    backup restored while its deployment runs): this leader refuses to act."""


class CommandFailed(DispatchError):
    """A command ran and exited non-zero with an error that is not classified further."""

    def __init__(self, message: str, *, argv: tuple[str, ...] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
