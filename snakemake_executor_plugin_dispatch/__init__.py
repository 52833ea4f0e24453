"""Snakemake executor plugin ``dispatch``: ``snakemake --executor dispatch`` runs every
job of a workflow as a dispatch-controller job, through ``controller.client.Client``
against the daemon's database (the daemon does all of the Slurm side).

Snakemake finds it by its package name (``snakemake_executor_plugin_*``); it needs
``common_settings``, ``Executor`` and ``ExecutorSettings`` here.
"""

from __future__ import annotations

from snakemake_interface_executor_plugins.settings import CommonSettings

from snakemake_executor_plugin_dispatch.executor import Executor
from snakemake_executor_plugin_dispatch.settings import ExecutorSettings

common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    # Snakemake's --envvars reach the job as an export before its command (dispatch jobs
    # run with --export=NIL); like every env value they are stored by slurmctld
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)

__all__ = ["Executor", "ExecutorSettings", "common_settings"]
