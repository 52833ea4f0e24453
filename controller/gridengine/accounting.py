"""The accounting file, followed: Grid Engine's only witness of a job that left qstat.

``qacct`` reads ``$SGE_ROOT/$SGE_CELL/common/accounting`` and scans it from the start
for every question (a site's file can be hundreds of GB), so the adapter does not call
it: it keeps an offset into the file and, when a job has left qstat, reads only the
bytes appended since (``read_script``: ``tail -c +OFFSET | head -c LIMIT | base64``,
so any byte survives any transport), keeping the records of our user's ``dj-`` jobs
(``AccountingIndex``). A file that shrank was rotated or replaced: it is read from 0
again. The first read of a process starts ``first_read_bytes`` before the end (at the
next line), not at 0. Pure: the adapter runs the script.

A record (accounting(5), 45 ``:``-separated fields; testdata/gridengine/NOTES.md):
owner, job_name, job_number, account (``-A``), submission/start/end time (epoch
seconds), ``failed``, ``exit_status`` (128 + signal when killed), task number, PE task
id. Several records may name one job number: an ``Eqw`` job gets one at once and
another when it runs after ``qmod -cj``; a rescheduled job gets one per run (``failed
25`` with submission time 0); PE slave tasks have their own (``pe_taskid`` not NONE);
and job numbers wrap. ``pick_record`` chooses a ref's.
"""

from __future__ import annotations

import base64
import binascii
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from controller.errors import ProtocolError
from controller.model.obs import ObjectRef
from controller.slurm import naming

FIELDS: Final = 45
DEFAULT_ACCOUNTING_FILE: Final = "/var/lib/gridengine/default/common/accounting"  # Debian
READ_LIMIT: Final = 8 * 1024 * 1024  # bytes of one read
FIRST_READ_BYTES: Final = 256 * 1024 * 1024  # how far back the first read of a process looks


@dataclass(frozen=True, slots=True)
class AccountingRecord:
    qname: str
    host: str
    owner: str
    name: str
    number: int
    account: str
    submit: int
    start: int
    end: int
    failed: int
    exit_status: int
    task_number: int
    pe_taskid: str


def parse_record(line: str) -> AccountingRecord:
    """One line of the accounting file (``ProtocolError`` when it is not one)."""
    parts = line.split(":")
    if len(parts) < FIELDS:
        raise ProtocolError(f"accounting: {len(parts)} fields, not {FIELDS}")
    try:
        return AccountingRecord(
            qname=parts[0], host=parts[1], owner=parts[3], name=parts[4],
            number=int(parts[5]), account=parts[6], submit=int(parts[8]),
            start=int(parts[9]), end=int(parts[10]), failed=int(parts[11]),
            exit_status=int(parts[12]), task_number=int(parts[35]), pe_taskid=parts[41])
    except ValueError as exc:
        raise ProtocolError(f"accounting: a number field is not a number: {exc}") from exc


def read_script(path: str, offset: int, *, limit: int = READ_LIMIT,
                tail_bytes: int | None = None) -> str:
    """A sh script that prints the file's size on one line, then the offset it read from
    and the base64 of at most ``limit`` bytes from there. With ``tail_bytes`` (the first
    read of a process) the read starts that many bytes before the end instead."""
    start = (f'o=$((s > {tail_bytes} ? s - {tail_bytes} : 0))' if tail_bytes is not None
             else f"o={offset}; [ \"$s\" -lt {offset} ] && o=0")
    return (f"F={shlex.quote(path)}\n"
            's=$(wc -c <"$F") || exit 3\n'
            f"{start}\n"
            'printf \'%s %s\\n\' "$s" "$o"\n'
            f'[ "$s" -gt "$o" ] && tail -c +$((o + 1)) -- "$F" | head -c {limit} | base64 '
            "| tr -d '\\n'\n"
            "printf '\\n'\n")


@dataclass(slots=True)
class AccountingIndex:
    """The records of our user's ``dj-`` jobs read so far, by job number, and where the
    next read starts. ``feed`` takes what ``read_script`` printed."""

    user: str
    offset: int | None = None  # None: never read (the first read looks back)
    records: dict[int, list[AccountingRecord]] = field(default_factory=dict)
    skipped: int = 0  # lines that were not records (logged by the adapter)

    def feed(self, output: str) -> bool:
        """Take one read; whether there may be more to read now."""
        head, _, body = output.partition("\n")
        words = head.split()
        if len(words) != 2 or not all(w.isascii() and w.isdigit() for w in words):
            raise ProtocolError(f"accounting read: bad header {head!r:.60}")
        size, start = int(words[0]), int(words[1])
        try:
            data = base64.b64decode(body.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProtocolError("accounting read: not base64") from exc
        if self.offset is not None and start not in (self.offset, 0):
            raise ProtocolError("accounting read: started at an unexpected offset")
        # (start 0 after an offset: the file shrank, rotated or replaced: read it again)
        skip = 0
        if self.offset is None and start > 0:
            newline = data.find(b"\n")  # (looked back: the first line may be partial)
            if newline < 0:
                self.offset = start
                return False
            skip = newline + 1
        end = data.rfind(b"\n")
        complete = data[skip:end + 1] if end >= skip else b""
        self.offset = start + (end + 1 if end >= skip else skip)
        self.add_lines(complete.decode("utf-8", errors="replace").splitlines())
        return start + len(data) < size and end >= 0  # the read stopped short of the end

    def add_lines(self, lines: Iterable[str]) -> None:
        prefix = naming.NAME_PREFIX
        for line in lines:
            if not line or line.startswith("#"):
                continue
            parts = line.split(":", 6)
            if len(parts) < 7 or parts[3] != self.user or not parts[4].startswith(prefix):
                continue
            try:
                record = parse_record(line)
            except ProtocolError:
                self.skipped += 1
                continue
            self.records.setdefault(record.number, []).append(record)

    def prune(self, before: int) -> None:
        """Forget records that ended before ``before`` (epoch seconds)."""
        for number in list(self.records):
            kept = [r for r in self.records[number] if max(r.end, r.submit) >= before]
            if kept:
                self.records[number] = kept
            else:
                del self.records[number]


def pick_record(ref: ObjectRef, records: Sequence[AccountingRecord], *,
                user: str) -> AccountingRecord | None:
    """The record of ``ref``'s object: the job number, the exact name and our user; the
    master record (not a PE slave task's); submitted at ``ref.submit``, or later (a
    rescheduled run's record carries the reschedule time) with the same account string
    as the run at ``ref.submit`` when that run has a record. The last such record in the
    file wins (an ``Eqw`` cleared and run: the run's). A record whose submission time is
    0 (a reschedule's) names no submission and is never taken."""
    ours = [r for r in records
            if r.number == ref.id and r.name == ref.uid and r.owner == user
            and r.pe_taskid == "NONE" and r.submit > 0]
    exact = [r for r in ours if r.submit == ref.submit]
    later = [r for r in ours if r.submit > ref.submit
             and (not exact or r.account == exact[-1].account)]
    chosen = [r for r in ours if r in exact or r in later]
    return chosen[-1] if chosen else None
