"""The Slurm adapter: SPEC §2-§5 against a real cluster, every command through a ``Runner``.

``SlurmAdapter`` implements ``controller.reconcile.ports.SchedulerPort`` and the rest of the
operations a client of one Slurm cluster needs (Inspect, Requeue, Output, Preflight). It
owns three things nothing else may do:

* **which Slurm command answers which question** (one argv list each; quoting happens
  only in the sh scripts of Start, Output and missing_paths);
* **the identity check** before every write (SPEC §2): the job with the ref's id is read
  from slurmctld *now* -- a single-id ``squeue -j <id>`` (slurmctld's cheap
  ``slurm_load_job`` path), or, for the checks of concurrent writes joined into one
  command (``coalesce``), ``squeue --me -j <id>,<id>,...`` (one RPC for our user's jobs)
  -- and the write goes ahead only when the id, the exact name and
  the submit time (equal, or later when the restart count is above zero) agree, the job
  belongs to our user and its comment is ours. Anything else acts on nothing. Where the
  cluster's writes take a SLUID (26.05: Preflight's ``identity == "sluid"``) the write
  then names the job by it (``_write``), not by the reusable numeric id, and a ref that
  recorded a SLUID must match it: a stale ref can touch no other job even if the check
  above were wrong. 24.11 records the SLUID in sacct only (read, never written by);
  22.05 has none;
* **error mapping**: Slurm's messages become ``controller.errors`` once, in
  ``failures.slurm_failure``; no other module matches Slurm's text.

``SlurmAdapter`` is the facade; each concern has a module of its own (pure ones do no
I/O and are import-linter's "Pure core"):

* ``capabilities`` (pure): ``Capabilities``, versions, identity, ``preflight_problems``;
  ``preflight``: the probes;
* ``identity`` (pure): ``same_job``, ``pick_record``, ``write_target`` over the one rule
  of ``controller.model.identity``;
* ``reads``: squeue and sacct reads, FindMany's row memory, Inspect;
* ``writes``: Stop, Hold, Release, Requeue, the write argv, joined writes;
* ``startbatch``: the Start batch protocol and Start;
* ``output``: Output, started_evidence, missing_paths; ``output_scripts`` (pure): their
  sh scripts (golden-tested);
* ``stats`` (pure): cluster statistics;
* ``base``: what the parts share (runner, clock, write guard, columns);
* ``failures``: the error mapping (``slurm_failure``), one table of Slurm's messages.

Writes of many jobs
-------------------
Releases and cancels issued together (a burst's gates opening, a sweep) share one
command per kind after their joined identity read: ``scontrol release <t>,<t>,...`` and
``scancel --user=<us> <id> <id> ...`` (or ``scancel <sluid> ...``). Only targets that
passed their own check are named; when the joined command fails, which job made it fail
is not read from the text: each job is checked again and written alone. Holds (a begin
time per job) and requeues stay one command each.

Reading the queue
-----------------
Find and FindMany make **one** command for any number of jobs::

    squeue -h --me --states=all -O <dialects.SQUEUE_TEXT_FORMAT>

and keep, byte for byte, the rows named ``dj-<ULID>`` that were asked for and belong to
our user. The text form is the reader on every supported version (22.05 .. 26.05):

* ``--me`` is applied by slurmctld in the text form on every version (squeue sends the
  one-user RPC), so the answer holds only our jobs. 22.05's ``--json`` ignores every
  filter and dumps every job of every user -- on a busy cluster that is the most
  expensive call there is, and the only correct use of it would be client-side
  filtering of everybody's jobs;
* from 24.05.1 ``squeue --json`` honours the filters too, but it serialises every field
  of every job through the data_parser (kilobytes per job, against ~250 bytes of text
  for the 18 columns we read), and its shape changes with each data_parser version.
  slurmctld's work is the same either way (the same RPC), so text is the cheaper read
  for the same answer, and one code path is exercised by the real-cluster tests on
  every version;
* the text form cannot print a '|' in a name safely, so only rows that start
  ``<id>|dj-<ULID>|`` are parsed at all: no other job of the user, whatever its name,
  can break or shift a read of ours.

So there is no JSON reader and no per-version choice of one: ``dialects`` parses the two
text forms, and Preflight records what differs between versions that the text reader
uses (the SLUID columns, ``Capabilities.identity``).

Accounting
----------
Once a job has left slurmctld's memory (``MinJobAge``), Inspect and InspectMany read
``sacct -X -D -P -n -o <dialects.SACCT_TEXT_FIELDS> -j <ids> -S <since>`` (text, because
22.05's sacct JSON reports exit code 0 for every normal exit). ``-D`` returns every
record of a reused id; the record of *this* object is chosen by ``pick_record``: the
chain of records that starts at the ref's exact submit time with the ref's name, and
continues only through records that Slurm requeued (REQUEUED, NODE_FAIL, PREEMPTED) and
whose comment names the same submission. The newest record of that chain is the
object's state. A record of a job that reused the id (even one of the same dispatch
job) is never taken for it: Inspect also cuts the chain at the submit time of the live
job that holds the id now, and where neither that nor the comments can tell (a newer
record still pending or running, so without its comment) sacct's row is refused by
``classify`` rather than reported.

Start
-----
Each Start script (``script.render_start_script``, unchanged) runs as a shell function
in its own subshell, and the same runner call reads the new job back; Starts issued
together share one call (``batch_script``): one round trip, one process spawn, one
read-back squeue for many submissions, each keeping its own exit status and messages.
An outcome that is not known (the call failed, timed out, the shell died before the
script reported) is resolved by rediscovery by name and submission, never by
submitting again.

Output
------
Output lists a submission's execution files and reads new bytes by offset on the Slurm
host (``tail -c +N | head -c M | base64``), so binary output survives any transport.

Times
-----
Slurm's clients print and parse times in the local time zone; the runners run every
command with ``TZ=UTC`` and this module formats every time it sends as UTC
``YYYY-MM-DDTHH:MM:SS``. A hold is read back after it is set, to confirm the exact second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from controller.errors import (
    ErrInvalid,
)
from controller.reconcile.ports import ClusterStats
from controller.runner.base import DEFAULT_COMMAND_TIMEOUT_S, Runner
from controller.slurm import script, stats
from controller.slurm.base import JOINED_LIMIT, Sleep
from controller.slurm.capabilities import (
    IDENTITY_CLASSIC,
    IDENTITY_SLUID,
    IDENTITY_SLUID_ACCOUNTING,
    REQUIRED_COMMANDS,
    SLUID_WRITES_SINCE,
    SUPPORTED_MAX,
    SUPPORTED_MIN,
    Capabilities,
    identity_for,
    parse_show_config,
    parse_slurm_version,
    preflight_problems,
)
from controller.slurm.dialects import squeue_format as _squeue_format
from controller.slurm.dialects import utc_text
from controller.slurm.failures import RATE_LIMIT_RETRY_S, slurm_failure
from controller.slurm.identity import pick_record
from controller.slurm.output import Outputs, Stream
from controller.slurm.output_scripts import MISSING_PATHS_SCRIPT_LIMIT, OUTPUT_CHUNK
from controller.slurm.preflight import Preflight
from controller.slurm.reads import SACCT_ARG_LIMIT, our_rows
from controller.slurm.startbatch import (
    REDISCOVERY_WINDOW_S,
    START_BATCH_BYTES,
    Starts,
    batch_script,
    parse_batch_output,
    parse_parsable,
)
from controller.slurm.stats import RECENT_START_WINDOW_S
from controller.slurm.writes import Writes

__all__ = [
    "IDENTITY_CLASSIC",
    "IDENTITY_SLUID",
    "IDENTITY_SLUID_ACCOUNTING",
    "JOINED_LIMIT",
    "MISSING_PATHS_SCRIPT_LIMIT",
    "OUTPUT_CHUNK",
    "RATE_LIMIT_RETRY_S",
    "RECENT_START_WINDOW_S",
    "REDISCOVERY_WINDOW_S",
    "REQUIRED_COMMANDS",
    "SACCT_ARG_LIMIT",
    "SLUID_WRITES_SINCE",
    "START_BATCH_BYTES",
    "SUPPORTED_MAX",
    "SUPPORTED_MIN",
    "Capabilities",
    "Sleep",
    "SlurmAdapter",
    "Stream",
    "_squeue_format",
    "batch_script",
    "identity_for",
    "our_rows",
    "parse_batch_output",
    "parse_parsable",
    "parse_show_config",
    "parse_slurm_version",
    "pick_record",
    "preflight_problems",
    "slurm_failure",
    "utc_text",
]


# --------------------------------------------------------------------------------------
# The adapter


class SlurmAdapter(Starts, Writes, Outputs, Preflight):
    """One Slurm cluster, reached through ``runner``, acting as Slurm user ``user``.

    ``cluster`` is ``ObjectRef.cluster`` of every object; a ref of another cluster is never
    found and never acted on. ``capabilities`` (from ``preflight``) is optional: without it
    the adapter asks sacct and maps its answer. Every command is bounded by
    ``command_timeout`` seconds. ``sleep``, ``poll_interval`` (Output's follow) and
    ``stop_confirm_s`` (how long Stop waits for the job to end) are injectable for tests.
    Concurrent Starts are coalesced into shared runner calls of at most ``start_batch``
    scripts and ``start_batch_bytes`` bytes of them, at most ``start_parallel`` calls in
    flight (see ``start``). ``start_batch`` is 64: each batch ends with one read-back
    ``squeue --me``, which slurmctld answers with every job of the user (ended ones too,
    for MinJobAge), so on a table of 6,500-8,500 jobs 256 Starts ran at 0.85-0.89x a raw
    ``sbatch --hold`` loop in batches of 32 and 1.06-1.14x in batches of 64
    (``bench/burst/starts.py``, 2026-12-02).
    """

    def __init__(self, runner: Runner, *, cluster: str, settings: script.StartSettings,
                 user: str, clock: Callable[[], float] = time.time,
                 capabilities: Capabilities | None = None,
                 command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
                 sleep: Sleep = asyncio.sleep, poll_interval: float = 2.0,
                 stop_confirm_s: float = 10.0, start_batch: int = 64,
                 start_parallel: int = 2,
                 write_guard: Callable[[], None] | None = None,
                 start_batch_bytes: int = START_BATCH_BYTES) -> None:
        if not cluster:
            raise ErrInvalid("must not be empty", field="cluster")
        if not user:
            raise ErrInvalid("must not be empty", field="user")
        if start_batch < 1 or start_parallel < 1 or start_batch_bytes < 1:
            raise ErrInvalid("must be at least 1",
                             field="start_batch/start_parallel/start_batch_bytes")
        script.check_output_dir(settings.output_dir)
        self.cluster = cluster
        self.user = user
        self.capabilities = capabilities
        self._runner = runner
        self._settings = settings
        self._clock = clock
        self._timeout = float(command_timeout)
        self._sleep = sleep
        self._poll_interval = poll_interval
        self._stop_confirm_s = stop_confirm_s
        self._write_guard = write_guard
        self._init_starts(start_batch=start_batch, start_parallel=start_parallel,
                          start_batch_bytes=start_batch_bytes)
        self._init_reads()
        self._init_writes()

    async def cluster_stats(self) -> ClusterStats:
        """Running and pending jobs of all users, down/drained nodes, and waits: one
        squeue over every user's pending and running jobs plus one sinfo."""
        queue, nodes = await asyncio.gather(
            self._checked_run(stats.QUEUE_ARGV, "squeue (cluster stats)"),
            self._checked_run(stats.NODES_ARGV, "sinfo"))
        return stats.parse_cluster_stats(queue.stdout, nodes.stdout, now=self._now())
