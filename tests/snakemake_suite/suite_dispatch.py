"""Snakemake's own executor test suite for the dispatch executor, run by
``tests/test_snakemake_suite.py`` in a pytest of its own, as the job user, from
``.venv-jobs`` (not collected by the project's pytest: no ``test_`` prefix).

``DISPATCH_SUITE_DATABASE_URL`` names the daemon's database and
``DISPATCH_SUITE_POLICY`` the recovery policy file."""

import os

from snakemake.common.tests import TestWorkflowsLocalStorageBase

from snakemake_executor_plugin_dispatch import ExecutorSettings


class TestDispatchExecutor(TestWorkflowsLocalStorageBase):
    __test__ = True

    def get_executor(self) -> str:
        return "dispatch"

    def get_executor_settings(self) -> ExecutorSettings:
        return ExecutorSettings(database_url=os.environ["DISPATCH_SUITE_DATABASE_URL"],
                                policy=os.environ["DISPATCH_SUITE_POLICY"])
