"""The identity rule of SPEC §2: whether a Slurm job seen now is the object a ref names.

One rule for every layer: the adapter applies it to a job it just read before a write
(``controller.slurm.identity.same_job``), the planner to an observation
(``controller.reconcile.plan.same_object``). Each passes what it knows; pure, no I/O.
"""

from __future__ import annotations

from controller.model.obs import ObjectRef


def same_object(ref: ObjectRef, *, job_id: int, name: str, submit: int,
                restart_count: int | None, sluid: str | None = None) -> bool:
    """Whether a job with this id, name, submit time, restart count and SLUID is
    ``ref``'s object.

    The id and the name must be ``ref``'s. At ``ref``'s exact submit time it is the
    object, unless both SLUIDs are known and differ (a SLUID is never reused: another
    job, whatever else matches). Slurm moves the submit time when it requeues a job (and
    gives it a new SLUID): a later submit time is the same object when the restart count
    says it was requeued, or when the restart count is unknown (``None``: an accounting
    record, which the adapter matched to ``ref`` by following the requeue chain,
    ``controller.slurm.identity.pick_record``).
    """
    if job_id != ref.id or name != ref.uid:
        return False
    if submit == ref.submit:
        return ref.sluid is None or sluid is None or ref.sluid == sluid
    return (restart_count is None or restart_count > 0) and submit >= ref.submit
