"""The outcomes of a tick's actions that the next plan of their job is given
(``plan.Observed.outcomes``): sbatch refused or deferred, outputs present or missing, a
lost object's start evidence. Kept in memory only (a lost outcome costs one more adopt
window or one more check, never a wrong status), and only for tracked jobs: an outcome
lives and dies with its job, so one that can never be planned never keeps the shard
ticking back to back. Pure."""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence

from controller.reconcile.plan import Outcome


class OutcomeBook:
    """The outcomes not planned yet, by job id."""

    def __init__(self) -> None:
        self._book: dict[str, list[Outcome]] = {}

    def __bool__(self) -> bool:
        """Some outcome waits for its plan (the next tick should come at once)."""
        return bool(self._book)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._book

    def ids(self) -> set[str]:
        return set(self._book)

    def of(self, job_id: str) -> tuple[Outcome, ...]:
        return tuple(self._book.get(job_id, ()))

    def note(self, job_id: str, outcome: Outcome, *, tracked: Container[str]) -> None:
        """What an action found, for the next plan of ``job_id``; dropped when the job
        left tracking meanwhile (nothing will plan it)."""
        if job_id in tracked:
            self._book.setdefault(job_id, []).append(outcome)

    def spend(self, job_id: str, spent: Sequence[Outcome]) -> None:
        """Drop the outcomes a committed plan was given (not any noted since)."""
        left = [o for o in self._book.get(job_id, ()) if not any(o is s for s in spent)]
        if left:
            self._book[job_id] = left
        else:
            self._book.pop(job_id, None)

    def forget(self, job_ids: Iterable[str]) -> None:
        """Jobs that left tracking: their outcomes go with them."""
        for job_id in job_ids:
            self._book.pop(job_id, None)

    def keep_only(self, tracked: Container[str]) -> None:
        """Drop the outcomes of every job not in ``tracked``."""
        for job_id in [j for j in self._book if j not in tracked]:
            del self._book[job_id]

    def clear(self) -> None:
        self._book.clear()
