"""What every part of the Slurm adapter shares: its hold on one cluster.

``AdapterBase`` carries the cluster, the user, the capabilities Preflight found, the
runner, timeout, clock and write guard (``SlurmAdapter``'s constructor sets them), and
the primitives on them: running a command (``_run``, ``_checked_run``), the write guard,
the squeue/sacct columns the capabilities allow, the identity check of a job just read
(``_same_object``) and its classification (``_observe``). The adapter's parts
(``reads``, ``writes``, ``startbatch``, ``output``, ``preflight``) are mixins over it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from controller.errors import ProtocolError
from controller.model.obs import ObjectObs, ObjectRef, Source
from controller.runner.base import CommandResult, Runner
from controller.slurm import dialects, identity, script
from controller.slurm.capabilities import Capabilities
from controller.slurm.classify import DEFAULT_SLURM_UIDS, Share, classify
from controller.slurm.failures import slurm_failure
from controller.slurm.record import SlurmJob

Sleep = Callable[[float], Awaitable[None]]

# Jobs named in one joined identity read (``squeue -j``: one RPC however many): at most
# ~8 KiB of ids on a command line.
JOINED_LIMIT: Final = 512
# Jobs named in one joined write: ``scontrol release`` and ``scancel`` send one RPC per
# job, so such a command is given PER_JOB_RPC_S more time per extra job (below), and
# kept to this many jobs, which bounds its timeout.
JOINED_WRITE_LIMIT: Final = 64
# Extra seconds a command gets for each further RPC it makes (a Start batch: an sbatch
# per script; a joined write: an update per job). With slurmctld's RPC rate limit on
# (rl_enable) the client library sleeps and resends a refused RPC without failing: ~1 s
# per refusal at the least, 2 RPC-seconds per sbatch when the bucket is empty (measured
# on 24.11 and 26.05, tests/test_e2e_rate_limit.py).
PER_JOB_RPC_S: Final = 2.0


class AdapterBase:
    """The state and primitives the adapter's parts share (module docstring)."""

    cluster: str
    user: str
    capabilities: Capabilities | None
    _runner: Runner
    _settings: script.StartSettings
    _clock: Callable[[], float]
    _timeout: float
    _sleep: Sleep
    # called right before every command that changes Slurm (sbatch, scancel, scontrol
    # update/release/requeue): raises LeaseLost when this process may no longer write
    _write_guard: Callable[[], None] | None

    # ------------------------------------------------------------ commands

    async def _run(self, argv: Sequence[str]) -> CommandResult:
        return await self._runner.run(argv, timeout=self._timeout)

    async def _checked_run(self, argv: Sequence[str], operation: str) -> CommandResult:
        result = await self._run(argv)
        if not result.ok:
            raise slurm_failure(result, operation=operation)
        return result

    def _now(self) -> int:
        return int(self._clock())

    def _guard_write(self) -> None:
        """Raise (``LeaseLost``) when this process may no longer write to Slurm."""
        if self._write_guard is not None:
            self._write_guard()

    # ------------------------------------------------------------ SLUID (capabilities)
    # Only what a successful Preflight found counts: without it, nothing asks for the
    # SLUID (squeue on 24.11/22.05 answers an unknown field with an error and NO rows,
    # exit status 0) and every write names the numeric id.

    # Each read takes the columns once, before its command runs, and parses with those:
    # a Preflight that finishes meanwhile changes the next read, never this one.

    def _squeue_columns(self) -> tuple[str, ...]:
        caps = self.capabilities
        if caps is not None and caps.squeue_sluid:
            return dialects.SQUEUE_TEXT_COLUMNS_SLUID
        return dialects.SQUEUE_TEXT_COLUMNS

    def _sacct_columns(self) -> tuple[str, ...]:
        caps = self.capabilities
        if caps is not None and caps.sacct_sluid:
            return dialects.SACCT_TEXT_COLUMNS_SLUID
        return dialects.SACCT_TEXT_COLUMNS

    # ------------------------------------------------------------ jobs read

    def _same_object(self, ref: ObjectRef, job: SlurmJob) -> bool:
        """SPEC §2's identity check, plus: the job is our user's (``identity.same_job``)."""
        return identity.same_job(ref, job, cluster=self.cluster, user=self.user)

    def _observe(self, job: SlurmJob, source: Source = Source.LIVE, *,
                 now: int | None = None, share: Share | None = None) -> ObjectObs:
        return classify(job, source=source, cluster=self.cluster,
                        now=self._now() if now is None else now, slurm_uids=self._slurm_uids(),
                        share=share)

    def _slurm_uids(self) -> frozenset[int]:
        """Whose cancels are Slurm's own: root, and the SlurmUser preflight found."""
        caps = self.capabilities
        if caps is None or caps.slurm_user_uid is None:
            return DEFAULT_SLURM_UIDS
        return DEFAULT_SLURM_UIDS | {caps.slurm_user_uid}

    def _ref(self, job: SlurmJob) -> ObjectRef:
        if job.submit_time is None:
            raise ProtocolError(f"job {job.job_id} has no submit time")
        return ObjectRef(cluster=self.cluster, uid=job.name, id=job.job_id,
                         submit=job.submit_time, sluid=job.sluid)
