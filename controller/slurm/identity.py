"""Which Slurm job is a ref's object (SPEC §2), and what a write names it by.

``same_job``: the identity check before every write, of a job slurmctld holds now (the
rule of ``controller.model.identity``, plus: the cluster and the user are ours).
``pick_record``: the accounting record that is a ref's object, following Slurm's requeue
chain. ``write_target``: the job's SLUID where the cluster's writes take one, else its
numeric id. Pure: the adapter reads the jobs (``controller.slurm.reads``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from controller.model import identity
from controller.model.obs import ObjectRef
from controller.slurm import naming
from controller.slurm.capabilities import IDENTITY_SLUID, Capabilities
from controller.slurm.record import SlurmJob

# Where an ended record of accounting continues as the same Slurm job (a requeue).
_REQUEUE_RECORD_STATES: Final = frozenset({"REQUEUED", "NODE_FAIL", "PREEMPTED"})


def same_job(ref: ObjectRef, job: SlurmJob, *, cluster: str, user: str) -> bool:
    """SPEC §2's identity check of a job read from slurmctld, plus: the job is our
    user's on our cluster. A restart count the read did not give counts as none."""
    if ref.cluster != cluster or job.user != user or job.submit_time is None:
        return False
    return identity.same_object(ref, job_id=job.job_id, name=job.name,
                                submit=job.submit_time,
                                restart_count=job.restart_count or 0, sluid=job.sluid)


def write_target(ref: ObjectRef, job: SlurmJob, capabilities: Capabilities | None) -> str:
    """What a write names the identity-checked ``job`` (``ref``'s object) by: its
    SLUID as just read where the cluster's writes take one (the live one: each requeue
    gives the job a new SLUID, so a ref's may be an earlier run's), else its numeric
    id. Requeued between the read and the write, the job is not found: nothing done."""
    if (capabilities is not None and capabilities.identity == IDENTITY_SLUID
            and job.sluid is not None):
        return job.sluid
    return str(ref.id)


def pick_record(ref: ObjectRef, records: Sequence[SlurmJob], *, user: str,
                before: int | None = None) -> SlurmJob | None:
    """The accounting record that is ``ref``'s object now, or None (``adapter``'s
    docstring, "Accounting").

    ``records`` are sacct rows of ``ref.id`` in any order. The chain starts at the record
    with ``ref``'s name, our user and exactly ``ref.submit``; a later record continues it
    only when the one before was requeued by Slurm and the comments (when both are known)
    name the same submission. ``before``, when given, is the submit time of a live job
    that holds the id now and is not ours: nothing from then on belongs to ``ref``.
    The text sacct that Inspect reads prints a requeued record's state as the one word
    ``REQUEUED`` (read as a flag in place of the base state) on 22.05, 24.11 and 26.05
    alike, as recorded, and the chain follows it (``_requeued_record``).
    """
    candidates = sorted(
        (rec for rec in records
         if rec.job_id == ref.id and rec.name == ref.uid and rec.user == user
         and rec.submit_time is not None and rec.submit_time >= ref.submit
         and (before is None or rec.submit_time < before)),
        key=lambda rec: rec.submit_time or 0)
    if not candidates or candidates[0].submit_time != ref.submit:
        return None
    first = candidates[0]
    if ref.sluid is not None and first.sluid is not None and first.sluid != ref.sluid:
        return None  # the same id, name and submit second, but another job
    # (each requeue gives the job a new SLUID: the chain's later records have their own)
    chain = [candidates[0]]
    submission = naming.parse_comment(candidates[0].comment)
    for rec in candidates[1:]:
        if not _requeued_record(chain[-1]):
            break
        parsed = naming.parse_comment(rec.comment)
        if parsed is not None and submission is not None and parsed[0] != submission[0]:
            break
        if submission is None:
            submission = parsed
        chain.append(rec)
    return chain[-1]


def _requeued_record(record: SlurmJob) -> bool:
    """An accounting record that Slurm requeued: the same Slurm job continues in a later
    record. Text sacct prints ``REQUEUED`` (a flag in place of the base); a node failure
    or preemption of a requeueable job is written as its own base state."""
    return record.base_state in _REQUEUE_RECORD_STATES or "REQUEUED" in record.flags
