"""The executor: submits each Snakemake job as a dispatch job (a database write), reads
every active job of the run back with one database query per status cycle, cancels the
run by its label, and re-adopts a killed run's jobs when Snakemake is started again.

It never runs a Slurm command: the daemon does, once per tick for every workflow.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from controller.client import Client
from controller.errors import DispatchError, ErrConflict, ErrInvalid
from controller.model.ids import is_job_id, new_job_id
from snakemake_executor_plugin_dispatch.journal import Journal
from snakemake_executor_plugin_dispatch.mapping import (
    RUN_LABEL,
    Ending,
    JobFacts,
    MappingError,
    Submit,
    job_document,
    journal_key,
    label_value,
    log_files,
    outcome,
    run_identity,
)
from snakemake_executor_plugin_dispatch.settings import resolve

# the least time between two status reads (Snakemake's tests ask for 0: a busy loop)
MIN_STATUS_INTERVAL_S = 0.5
# a job cancelled by this executor (Ctrl-C) is submitted anew by the next run
_STOPPED = "stopped"


def facts_of(job: JobExecutorInterface) -> JobFacts:
    """What the mapping needs of a Snakemake job."""
    group = bool(job.is_group())
    wildcards: Mapping[str, Any] = {} if group else (getattr(job, "wildcards_dict", None)
                                                      or {})
    return JobFacts(
        name=str(job.name),
        rules=tuple(sorted(str(r) for r in job.rules)),
        jobid=str(job.jobid),
        attempt=int(job.attempt),
        threads=int(job.threads),
        resources={str(k): v for k, v in job.resources.items()},
        wildcards={str(k): str(v) for k, v in wildcards.items()},
        outputs=tuple(str(f) for f in job.output),
        is_group=group,
    )


class Executor(RemoteExecutor):  # type: ignore[misc]
    def __post_init__(self) -> None:
        try:
            self._settings = resolve(self.workflow.executor_settings, dict(os.environ))
        except MappingError as exc:
            raise WorkflowError(str(exc)) from exc
        self._workdir = os.path.abspath(str(self.workflow.workdir_init))
        snakefile = os.path.abspath(str(self.workflow.main_snakefile))
        self._run_id = run_identity(self._workdir, snakefile)
        self._submit = Submit(run_id=self._run_id, workdir=self._workdir,
                              labels=self._settings.labels, cluster=self._settings.cluster,
                              ignore=self._settings.ignore)
        self._client = Client(self._settings.database_url)
        try:
            self._client.require_schema()  # fail now, not at the first job
        except DispatchError as exc:
            self._client.close()
            raise WorkflowError(f"dispatch: the daemon's database: {exc}") from exc
        state = os.path.join(self._workdir, ".snakemake", "dispatch")
        self._journal = Journal(Path(state, "journal"))
        self._log_root = os.path.join(state, "log")
        self._unreachable = False
        interval = self.workflow.remote_execution_settings.seconds_between_status_checks
        self.next_seconds_between_status_checks = max(MIN_STATUS_INTERVAL_S, interval or 0)
        self.logger.info(f"dispatch executor: run {self._run_id} (label {RUN_LABEL}="
                         f"{self._run_id})")

    # ---------------------------------------------------------- the command

    def get_python_executable(self) -> str:
        return self._settings.python or str(super().get_python_executable())

    # ---------------------------------------------------------- submission

    def run_job(self, job: JobExecutorInterface) -> None:
        facts = facts_of(job)
        key = journal_key(facts)
        resumed = self._resume(job, facts, key)
        if resumed is not None and resumed[1]:
            return
        job_id = resumed[0] if resumed is not None else new_job_id()
        log_base = self._log_base(facts, job_id)
        try:
            document = job_document(facts, command=self.format_job_exec(job),
                                    log_base=log_base, submit=self._submit)
        except MappingError as exc:
            raise WorkflowError(str(exc)) from exc
        self._journal.intend(key, job_id)
        try:
            self._client.submit(document, job_id=job_id, policy=self._settings.policy)
        except ErrConflict:
            pass  # a submission that was committed although its answer was lost
        except ErrInvalid as exc:
            self._journal.finish(key, job_id)
            raise WorkflowError(f"{'group' if facts.is_group else 'rule'} {facts.name}: "
                                f"the daemon's database refused the job: {exc}") from exc
        except DispatchError as exc:
            # the database could not be reached: the journal keeps the id, so a retry
            # (or a restart) submits this very job id or finds it written after all
            self.report_job_error(SubmittedJobInfo(job), msg=f"dispatch: submission of "
                                  f"{job_id} failed: {exc}. ")
            return
        self.report_job_submission(SubmittedJobInfo(
            job, external_jobid=job_id, aux={"key": key, "log_base": log_base}))

    def _log_base(self, facts: JobFacts, job_id: str) -> str:
        tag = label_value(",".join(f"{k}={v}" for k, v in facts.wildcards.items())
                          ) if facts.wildcards else ""
        return os.path.join(self._log_root, label_value(facts.name),
                            f"{tag}-{job_id}" if tag else job_id)

    def _resume(self, job: JobExecutorInterface, facts: JobFacts,
                key: str) -> tuple[str, bool] | None:
        """A job of an earlier Snakemake of this run: ``(id, adopted)`` -- adopted, or an
        id journaled but never written (to be submitted under that id); None: none."""
        registered = self.workflow.dag.incomplete_external_jobid(job)
        journaled = self._journal.open_job(key)
        candidates = [c for c in (registered, journaled) if c and is_job_id(str(c))]
        if not candidates:
            return None
        views = self._client.views_by_ids([str(c) for c in candidates])
        for job_id in map(str, candidates):
            view = views.get(job_id)
            if view is None or view.labels.get(RUN_LABEL) != self._run_id:
                continue
            if view.phase == "cancelled" and view.desired == _STOPPED:
                continue  # cancelled by an interrupted Snakemake: run it anew
            self.logger.info(f"Resuming dispatch job {job_id} ({view.phase}) of "
                             f"{facts.name}: not submitted again")
            self.report_job_submission(SubmittedJobInfo(
                job, external_jobid=job_id,
                aux={"key": key, "log_base": self._log_base(facts, job_id)}))
            return job_id, True
        if journaled and journaled not in views:
            return journaled, False  # journaled, never written: submit it under its id
        if journaled:
            self._journal.finish(key, journaled)
        return None

    # ---------------------------------------------------------- status

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo],
                                ) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not active_jobs:
            return
        ids = [str(j.external_jobid) for j in active_jobs]
        try:
            async with self.status_rate_limiter:
                views = await asyncio.to_thread(self._client.views_by_ids, ids)
        except DispatchError as exc:
            if not self._unreachable:
                self.logger.warning(f"dispatch: cannot read the jobs' status ({exc}); "
                                    "the jobs are kept as running until it answers")
            self._unreachable = True
            for info in active_jobs:
                yield info
            return
        if self._unreachable:
            self.logger.info("dispatch: the database answers again")
            self._unreachable = False
        for info in active_jobs:
            job_id = str(info.external_jobid)
            view = views.get(job_id)
            result = outcome(job_id, None if view is None else view.to_json())
            if result.ending is Ending.ACTIVE:
                yield info
                continue
            self._journal.finish(str(info.aux.get("key", "")), job_id)
            if result.ending is Ending.SUCCESS:
                self.report_job_success(info)
            else:
                self.report_job_error(info, msg=result.message,
                                      aux_logs=self._logs(str(info.aux.get("log_base", ""))))

    def _logs(self, log_base: str) -> list[str]:
        try:
            names = os.listdir(os.path.dirname(log_base))
        except OSError:
            return []
        return log_files(log_base, names)

    # ---------------------------------------------------------- cancel

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Ctrl-C: every job of the run stopped, in one database write (the daemon
        cancels them in Slurm)."""
        try:
            count = self._client.cancel_selector({RUN_LABEL: self._run_id})
        except DispatchError as exc:
            raise WorkflowError(f"dispatch: cancelling run {self._run_id} failed: {exc}; "
                                f"dispatchctl cancel -l {RUN_LABEL}={self._run_id}") from exc
        self.logger.info(f"dispatch: cancelled the jobs of run {self._run_id} ({count} "
                         f"rows stopped)")
        for info in active_jobs:
            self._journal.finish(str(info.aux.get("key", "")), str(info.external_jobid))

    def shutdown(self) -> None:
        super().shutdown()
        self._client.close()
