"""Reading jobs: the live queue (squeue) and accounting (sacct), always as text.

``Reads`` (a part of ``SlurmAdapter``) owns the reads: a single id (``_read_job``), the
identity reads before writes, joined into one ``squeue --me -j`` (``_read_ours``), our
jobs by name (``_read_mine``), Find and FindMany's one ``squeue --me`` for any number
of jobs with its memory of the last read's rows and runs of lines (``_classified_rows``),
Inspect and InspectMany (squeue, then sacct: ``identity.pick_record``). ``our_rows``
keeps only the rows that start ``<id>|dj-<ULID>|``: no other job of the user can break a
read of ours.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection, Iterator, Sequence
from typing import Final

from controller.coalesce import Coalescer
from controller.errors import ErrNotFound, ErrUnsupported, ProtocolError
from controller.model.obs import ObjectObs, ObjectRef, Source
from controller.slurm import dialects, naming
from controller.slurm.base import JOINED_LIMIT, AdapterBase
from controller.slurm.classify import Share, valid_until
from controller.slurm.dialects import squeue_format, utc_text
from controller.slurm.failures import slurm_failure
from controller.slurm.identity import pick_record
from controller.slurm.record import SlurmJob

log = logging.getLogger(__name__)

SACCT_ARG_LIMIT: Final = 100_000  # bytes of the ``-j`` list per sacct call

# A row of ours in squeue/sacct text: the id, then a discovery-shaped name, then '|'.
_OUR_ROW = re.compile(r"([0-9]+)\|(dj-[0-9A-Z]{26})\|")

class _Row:
    """find_many's memory of one squeue row, kept by the row's ``hash``, not by its text
    (``_classified_rows``): what it names, the second it was classified, the second from
    which it may no longer hold, and the last read that saw it.

    What it names is, for a row of ours, the one-element tuple of its observation that
    find_many hands out for it (kept with the row, so a steady read builds no new
    container per job, nothing for the cyclic collector to promote; the job is its ref's
    ``uid``); for another user's row named like ours, that name. No job id string is kept
    per row (at 100k rows that was 7 MB of copies of ids held elsewhere), and the rows
    are updated in place, read by read (a new 100k-entry dict per read left 5 MB of
    freed heap behind each time)."""

    __slots__ = ("made", "named", "read", "until")

    def __init__(self, named: tuple[ObjectObs] | str, made: int, until: int) -> None:
        self.named = named
        self.made = made
        self.until = until
        self.read = 0


class _Run:
    """find_many's memory of one run of consecutive squeue lines (``_runs``), kept by the
    run's ``hash``: its rows of ours in order (no job id string kept with them: 13 MB at
    100k rows), the second the newest of them was classified and the second the first of
    them may no longer hold; and, to check the hash, the run's length and its first and
    last characters. Kept only when every row of ours in it was classified (a read that
    skipped rows it was not asked for leaves its runs unremembered)."""

    __slots__ = ("head", "made", "read", "rows", "size", "tail", "until")

    def __init__(self, text: str, rows: list[_Row], read: int) -> None:
        self.rows = rows
        self.made = max((row.made for row in rows), default=0)
        self.until = min((row.until for row in rows), default=_FOREVER)
        self.size = len(text)
        self.head = text[:_CHECKED]
        self.tail = text[-_CHECKED:]
        self.read = read

    def holds(self, text: str, now: int) -> bool:
        """This memory is of ``text`` and every row of it still holds at ``now``."""
        return (self.made <= now < self.until and self.size == len(text)
                and text.startswith(self.head) and text.endswith(self.tail))


_FOREVER: Final = 2**63
# find_many splits the squeue text into runs of lines (``_runs``): at least this many
# characters, then up to the next line whose job id ends in "00" (about 90 kB, 360 rows,
# where ids are dense), and at most about ``_BLOCK`` characters: a 100k-row read never
# holds all its lines at once
_RUN: Final = 1 << 16
_BLOCK: Final = 1 << 18
_RUN_CUT = re.compile(r"\n(?=[0-9]*00\|)")
_CHECKED: Final = 64  # characters at each end of a run that its memory keeps


def _runs(text: str, least: int = _RUN) -> Iterator[str]:
    """``text`` in consecutive runs of at least ``least`` characters, each ending just
    before a line whose job id ends in "00" (or at the end of the text; after
    ``_BLOCK`` characters with no such line, just after a newline): where a run ends
    depends on the lines around it, not on its offset, so a row that appears, leaves or
    moves changes one or two runs, not every run after it. Their ``splitlines()``
    together are exactly ``text.splitlines()``: each run ends just after a newline."""
    start, size = 0, len(text)
    while start < size:
        cut = _RUN_CUT.search(text, start + least, start + _BLOCK)
        if cut is not None:
            end = cut.end()
        else:
            end = text.find("\n", start + max(least, _BLOCK - 1))
            end = size if end < 0 else end + 1
        yield text[start:end]  # the whole text itself when it is one run (no copy)
        start = end


def our_rows(text: str, *, names: Collection[str] | None = None) -> list[str]:
    """The lines of squeue/sacct text that start ``<id>|dj-<ULID>|`` (and, when ``names``
    is given, carry one of those names); every other line is not ours and is skipped."""
    rows: list[str] = []
    for line in text.splitlines():
        match = _OUR_ROW.match(line)
        if match is None or naming.job_id_of_name(match.group(2)) is None:
            continue
        if names is not None and match.group(2) not in names:
            continue
        rows.append(line)
    return rows


class Reads(AdapterBase):
    """squeue and sacct reads of one cluster (module docstring)."""

    _identity_reads: Coalescer[int, SlurmJob | None]
    _live_rows: dict[int, _Row]
    _live_runs: dict[int, _Run]
    _reads: int
    _valid_ids: list[str]

    def _init_reads(self) -> None:
        # identity reads of concurrent callers, joined (coalesce)
        self._identity_reads = Coalescer(self._read_ours_many, limit=JOINED_LIMIT, parallel=2)
        self._live_rows = {}  # find_many's rows of the last read, by hash
        self._live_runs = {}  # find_many's runs of lines of the last read, by hash
        self._reads = 0  # find_many's reads of squeue so far (``_Row.read``)
        self._valid_ids = []  # find_many's ids of the last call (checked)

    # ------------------------------------------------------------ live reads

    async def _read_job(self, job_id: int) -> SlurmJob | None:
        """The job with this id as slurmctld holds it now, when it has a name of ours;
        None when slurmctld does not know the id or the job there is not named ``dj-…``."""
        columns = self._squeue_columns()
        result = await self._run(["squeue", "-h", "-j", str(job_id), "--states=all",
                                  "-O", squeue_format(columns)])
        if not result.ok:
            error = slurm_failure(result, operation=f"squeue -j {job_id}")
            if isinstance(error, ErrNotFound):
                return None
            raise error
        for line in our_rows(result.stdout):
            for job in dialects.parse_squeue_text(line + "\n", columns=columns):
                if job.job_id == job_id:
                    return job
        return None

    async def _read_ours(self, job_id: int) -> SlurmJob | None:
        """The job with this id as slurmctld holds it now when it is ours and named
        ``dj-…`` (else None), for an identity check before a write: concurrent checks are
        joined into one command (``_read_ours_many``)."""
        return await self._identity_reads.call(job_id)

    async def _read_ours_many(self, job_ids: Sequence[int]) -> dict[int, SlurmJob | None]:
        """Each of ``job_ids`` (one id: ``_read_job``; several: one ``squeue --me -j``,
        whose job list squeue filters on our user's jobs, one RPC for all)."""
        if len(job_ids) == 1:
            return {job_ids[0]: await self._read_job(job_ids[0])}
        columns = self._squeue_columns()
        result = await self._run(["squeue", "-h", "--me", "--states=all",
                                  "-j", ",".join(str(i) for i in job_ids),
                                  "-O", squeue_format(columns)])
        if not result.ok:
            error = slurm_failure(result, operation=f"squeue -j ({len(job_ids)} ids)")
            if not isinstance(error, ErrNotFound):
                raise error
            # an id slurmctld no longer knows made the list fail: each on its own
            found = await asyncio.gather(*(self._read_job(i) for i in job_ids))
            return dict(zip(job_ids, found, strict=True))
        wanted = set(job_ids)
        jobs: dict[int, SlurmJob | None] = dict.fromkeys(job_ids)
        for line in our_rows(result.stdout):
            for job in dialects.parse_squeue_text(line + "\n", columns=columns):
                if job.job_id in wanted and job.user == self.user:
                    jobs[job.job_id] = job
        return jobs

    async def _read_mine(self, *, names: Collection[str],
                         name_filter: str | None = None) -> list[SlurmJob]:
        """Every job of ours in slurmctld's memory, any state, whose name is in ``names``
        (one squeue call; ``name_filter`` narrows it server-side to one name)."""
        argv = ["squeue", "-h", "--me", "--states=all"]
        if name_filter is not None:
            argv.append(f"--name={name_filter}")
        columns = self._squeue_columns()
        argv += ["-O", squeue_format(columns)]
        result = await self._checked_run(argv, "squeue --me")
        jobs: list[SlurmJob] = []
        for line in our_rows(result.stdout, names=names):
            jobs.extend(job for job in dialects.parse_squeue_text(line + "\n", columns=columns)
                        if job.user == self.user)
        return jobs

    # ------------------------------------------------------------ accounting reads

    def _accounting_known_off(self) -> bool:
        return self.capabilities is not None and not self.capabilities.accounting_history

    async def _sacct(self, selection: Sequence[str], *, since: int) -> list[SlurmJob]:
        """sacct text records (allocations, every record of a reused id) of our rows."""
        start = min(since, self._now())
        columns = self._sacct_columns()
        result = await self._checked_run(
            ["sacct", "-X", "-D", "-P", "-n", "-o", ",".join(columns),
             "-S", utc_text(start), *selection], "sacct")
        jobs: list[SlurmJob] = []
        for line in our_rows(result.stdout):
            jobs.extend(job for job in dialects.parse_sacct_text(line + "\n", columns=columns)
                        if job.user == self.user)
        return jobs


    # ------------------------------------------------------------ Find, Inspect

    async def find(self, job_id: str) -> list[ObjectObs]:
        """Every live object of dispatch job ``job_id`` (one squeue call)."""
        return list((await self.find_many([job_id]))[job_id])

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> dict[str, Sequence[ObjectObs]]:
        """Every live object of each dispatch job, with ONE squeue call for all of them.

        Only our user's jobs whose name is exactly ``dj-<ULID>`` of an asked-for id are
        returned; a job whose comment is not ours is returned with ``foreign=True``.
        With ``strays``, the objects named ``dj-<ULID>`` of ids NOT asked for are put there
        (from the same read): the late objects that no tracked record owns.

        A row byte-identical to one of the previous call's gives back the very same
        ``ObjectObs`` (its ``observed_at`` is when that row was first classified), unless
        its classification could have changed with the clock since: a start or end time
        that was still ahead then and is not now, or a clock that went back (see
        ``_classified_rows``). Only the rows of the last read are remembered.
        """
        ids = list(job_ids)
        if ids != self._valid_ids:  # usually the very same ids as the last call's
            for job_id in set(ids).difference(self._valid_ids):
                naming.discovery_name(job_id)  # ErrInvalid for a malformed id, as ever
            self._valid_ids = ids
        # one shared empty tuple for every job, and a remembered row's own tuple for a job
        # with one object: a steady 100k-job read allocates no container per job (they
        # would all survive into the oldest generation and trigger full collections)
        found: dict[str, Sequence[ObjectObs]] = dict.fromkeys(ids, ())
        if ids or strays is not None:
            await self._classified_rows(found, strays)
        return found

    async def _classified_rows(self, found: dict[str, Sequence[ObjectObs]],
                               strays: dict[str, list[ObjectObs]] | None = None) -> None:
        """Add to ``found[job id]`` the observation of each row of ours that
        ``_read_mine(names=<the names of found's ids>)`` would return, reusing the
        previous read's observation of each byte-identical row while it still holds:
        parsing and classifying 100k rows every tick would cost more than everything else
        together.

        A row's observation depends on the clock only through ``classify``'s comparisons
        of the start and end times with ``now`` (Slurm's estimates are None, a preemption
        grace ends): it holds from the second it was made until the first of those times
        that was still ahead. A row that fails to parse raises as before; the rows
        classified before it are remembered (each is its own byte-identical text's
        observation), and the rows of earlier reads that a read did not have are dropped
        only once a read completes.

        The rows are remembered by their ``hash`` (a 64-bit SipHash, keyed per process),
        not by their text: a 100k-row queue's text is kept once, by the runner's result,
        not once more as dictionary keys. A remembered observation is reused only for a
        row that names the same dispatch job (its id after ``<id>|dj-``), so equal hashes
        of two jobs' rows never mix them up; a changed row of the same job whose hash
        equals its previous row's (a chance of 2**-64 per change) would keep the previous
        observation until the row changes again or the observation expires.

        Before any line, the text is cut into runs of lines (``_runs``, about 360 rows
        each, cut where the lines say, so a row that changes, comes or goes changes the
        run around it only), and a run whose text hashes as one of a recent read's, of
        the same length and ends, whose rows all still hold, gives back its rows' very
        observations without a line of it being split out, hashed or looked up: an
        unchanged 100k-row queue costs its hashes, about 11 ms, plus one step per row
        to hand the observations out (issue 19). Runs are remembered the same way (by
        hash, a chance of 2**-64 per changed run of the same length and ends), those of
        the last read only.
        """
        columns = self._squeue_columns()
        argv = ["squeue", "-h", "--me", "--states=all", "-O", squeue_format(columns)]
        result = await self._checked_run(argv, "squeue --me")
        now = self._now()
        self._reads += 1
        read = self._reads
        runs = self._live_runs
        kept = 0  # rows of this read remembered (each stamped ``read``)
        wanted = found.get
        share = Share()  # one copy of the values the observations made now have in common
        parser = dialects.SqueueLines(columns)  # each distinct field decoded once per read
        skip = len(naming.NAME_PREFIX)
        for text in _runs(result.stdout):
            key = hash(text)
            run = runs.get(key)
            if run is None or not run.holds(text, now):
                run, complete = self._classified_run(text, now, parser=parser, share=share,
                                                     found=found, strays=strays, read=read)
                if complete:  # (rows skipped: not remembered as a run)
                    runs[key] = run
            run.read = read
            for row in run.rows:
                if row.read != read:
                    row.read = read
                    kept += 1
                named = row.named
                if isinstance(named, str):
                    continue  # another user's job
                job_id = named[0].ref.uid[skip:]
                into = wanted(job_id)
                if into is None:
                    if strays is not None:
                        strays.setdefault(job_id, []).extend(named)
                elif into:  # (several objects of one job: duplicates, rare)
                    found[job_id] = (*into, *named)
                else:
                    found[job_id] = named
        rows = self._live_rows
        if kept < len(rows):  # rows of earlier reads that this one did not have
            if kept < len(rows) // 2:  # (a dict never shrinks: a smaller one)
                self._live_rows = {key: row for key, row in rows.items() if row.read == read}
            else:
                for key in [key for key, row in rows.items() if row.read != read]:
                    del rows[key]
        for key in [key for key, run in runs.items() if run.read != read]:
            del runs[key]  # (runs of earlier reads: at most a few hundred in all)

    def _classified_run(self, text: str, now: int, *, parser: dialects.SqueueLines,
                        share: Share, found: dict[str, Sequence[ObjectObs]],
                        strays: dict[str, list[ObjectObs]] | None,
                        read: int) -> tuple[_Run, bool]:
        """The rows of ours of one run of lines (``_runs``), each the previous read's
        observation of its byte-identical row while it still holds, else classified now
        and remembered by its hash; and whether none of ours was skipped (not asked for,
        and no ``strays``): only such a run is remembered as one."""
        rows = self._live_rows
        before = rows.get
        skip = len(naming.NAME_PREFIX)
        complete = True
        out: list[_Row] = []
        for line in text.splitlines():
            key = hash(line)
            row = before(key)
            if row is not None and row.made <= now < row.until:
                named = row.named
                name = named if isinstance(named, str) else named[0].ref.uid
                if not line.startswith(name, line.find("|") + 1):
                    row = None  # (equal hashes of two jobs' rows)
            else:
                row = None
            if row is None:
                match = _OUR_ROW.match(line)
                if match is None or naming.job_id_of_name(match.group(2)) is None:
                    continue
                if strays is None and match.group(2)[skip:] not in found:
                    complete = False
                    continue
                row = rows[key] = self._classify_row(line, now, parser, share=share)
            out.append(row)
        return _Run(text, out, read), complete

    def _classify_row(self, line: str, now: int, parser: dialects.SqueueLines, *,
                      share: Share | None = None) -> _Row:
        """One squeue row of ours, remembered: what it names (its observation's
        one-element tuple, or the name of another user's job), the second it was made,
        and the second from which it may no longer hold. ``share`` (``classify``'s) gives
        the observation the values other rows have too."""
        job = parser.line(line, 1)
        if job.user != self.user:
            return _Row(job.name, now, _FOREVER)
        obs = self._observe(job, now=now, share=share)
        until = _FOREVER
        expires = valid_until(job, now=now)  # classify's own clock rules
        if expires is not None:
            until = min(until, expires if share is None else share(expires))
        return _Row((obs,), now, until)

    async def inspect(self, ref: ObjectRef) -> ObjectObs:
        """The object ``ref`` names, from squeue, or from sacct once it has left squeue.

        ErrNotFound when neither holds it (or accounting is off and squeue does not).
        A sacct record that is still pending or running is refused (ProtocolError).
        """
        if ref.cluster != self.cluster:
            raise ErrNotFound(f"inspect: ref of cluster {ref.cluster}, not {self.cluster}")
        job = await self._read_job(ref.id)
        before = None
        if job is not None:
            if self._same_object(ref, job):
                return self._observe(job)
            if job.submit_time is not None and job.submit_time > ref.submit:
                before = job.submit_time  # the id was reused: later records are not ours
        if self._accounting_known_off():
            raise ErrNotFound(f"inspect: job {ref.id} ({ref.uid}) is not in squeue and "
                              "accounting is off")
        try:
            records = await self._sacct(["-j", str(ref.id)], since=ref.submit)
        except ErrUnsupported as exc:
            raise ErrNotFound(f"inspect: job {ref.id} ({ref.uid}) is not in squeue and "
                              f"accounting is unavailable: {exc}") from exc
        record = pick_record(ref, records, user=self.user, before=before)
        if record is None:
            raise ErrNotFound(f"inspect: no job {ref.id} named {ref.uid} submitted at "
                              f"{ref.submit} in squeue or sacct")
        return self._observe(record, Source.ACCOUNTING)

    async def inspect_many(self, refs: Sequence[ObjectRef], *,
                           since: int) -> dict[ObjectRef, ObjectObs]:
        """Accounting observations of objects that left squeue: ONE sacct call (per
        ~100 KB of ids). Refs with no record of their own (or a record sacct cannot
        classify yet) are left out. ErrUnsupported without accounting."""
        if self._accounting_known_off():
            raise ErrUnsupported("inspect_many: this cluster has no accounting history")
        ours = [ref for ref in refs if ref.cluster == self.cluster]
        ids = sorted({ref.id for ref in ours})
        if not ids:
            return {}
        records: dict[int, list[SlurmJob]] = {}
        chunk: list[str] = []
        size = 0
        chunks: list[list[str]] = []
        for job_id in map(str, ids):
            if chunk and size + len(job_id) + 1 > SACCT_ARG_LIMIT:
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(job_id)
            size += len(job_id) + 1
        chunks.append(chunk)
        for part in chunks:
            for row in await self._sacct(["-j", ",".join(part)], since=since):
                records.setdefault(row.job_id, []).append(row)
        observed: dict[ObjectRef, ObjectObs] = {}
        for ref in ours:
            record = pick_record(ref, records.get(ref.id, ()), user=self.user)
            if record is None:
                continue
            try:
                observed[ref] = self._observe(record, Source.ACCOUNTING)
            except ProtocolError as exc:
                log.info("accounting record not classifiable yet",
                         extra={"slurm_id": ref.id, "uid": ref.uid, "error": str(exc)})
        return observed
