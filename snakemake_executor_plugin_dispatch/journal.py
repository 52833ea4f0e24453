"""The run's journal: which dispatch job each Snakemake job was given, kept in the
workflow's ``.snakemake/dispatch/journal`` so that a Snakemake killed at any moment and
started again finds the jobs it had submitted.

Snakemake itself records a job's external id (``incomplete_external_jobid``), but only
after the submission returned; the journal records the id *before* the submission
(``intend``), so a Snakemake killed between the database write and Snakemake's record
still finds the job on its next start instead of submitting it again. Once Snakemake
has taken the job's outcome, ``finish`` retires the entry. One JSON object per line,
appended and flushed to disk; a torn last line (a kill mid-write) is ignored.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class Journal:
    """Entries ``key -> dispatch job id`` of the jobs submitted and not yet finished."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._open: dict[str, str] = {}
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                key, job_id, done = str(entry["key"]), str(entry["id"]), bool(entry["done"])
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a kill
            if done:
                if self._open.get(key) == job_id:
                    del self._open[key]
            else:
                self._open[key] = job_id
        # start afresh with what is still open: the file does not grow run after run
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".new")
        temporary.write_text("".join(self._line(k, v, done=False)
                                     for k, v in sorted(self._open.items())),
                             encoding="utf-8")
        os.replace(temporary, self.path)

    @staticmethod
    def _line(key: str, job_id: str, *, done: bool) -> str:
        return json.dumps({"key": key, "id": job_id, "done": done}, sort_keys=True) + "\n"

    def _append(self, text: str, *, sync: bool) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())

    def open_job(self, key: str) -> str | None:
        """The dispatch job of ``key`` that was submitted (or about to be) and whose
        outcome Snakemake has not taken yet; None if there is none."""
        with self._lock:
            return self._open.get(key)

    def intend(self, key: str, job_id: str) -> None:
        """Record, durably, that ``key`` is about to be submitted as ``job_id``."""
        with self._lock:
            self._append(self._line(key, job_id, done=False), sync=True)
            self._open[key] = job_id

    def finish(self, key: str, job_id: str) -> None:
        """Snakemake took ``job_id``'s outcome: it is no longer ``key``'s open job."""
        with self._lock:
            if self._open.get(key) != job_id:
                return
            self._append(self._line(key, job_id, done=True), sync=False)
            del self._open[key]
