"""The executor's settings (``--dispatch-<field>`` on Snakemake's command line) and how
they are read: the database URL, the cluster, labels, a policy file, resources to let
through unused, and the Python the job runs."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from snakemake_executor_plugin_dispatch.mapping import MappingError, job_policy, parse_labels

DATABASE_URL_VARIABLES = ("SNAKEMAKE_DISPATCH_DATABASE_URL", "DISPATCH_DATABASE_URL")


# Optional[...], not "X | None": the settings are read into argparse by their
# annotations, which must be real types (no "from __future__ import annotations" here)
@dataclass
class ExecutorSettings(ExecutorSettingsBase):  # type: ignore[misc]
    database_url: Optional[str] = field(default=None, metadata={
        "help": "the dispatch-controller database (SQLAlchemy URL) the daemon reconciles; "
                "default: $SNAKEMAKE_DISPATCH_DATABASE_URL, else $DISPATCH_DATABASE_URL",
        "env_var": True, "required": False})
    cluster: Optional[str] = field(default=None, metadata={
        "help": "the configured cluster every job runs on (default: the daemon's default "
                "cluster)", "env_var": False, "required": False})
    labels: Optional[str] = field(default=None, metadata={
        "help": "extra labels of every job, k=v,k2=v2 (snakemake/* are the executor's)",
        "env_var": False, "required": False})
    policy: Optional[str] = field(default=None, metadata={
        "help": "a JSON recovery policy file for the infrastructure's failures (node lost, "
                "preempted, ...); application failures are Snakemake's --retries",
        "env_var": False, "required": False})
    ignore_resources: Optional[str] = field(default=None, metadata={
        "help": "resources (comma-separated) to submit without, instead of refusing the job",
        "env_var": False, "required": False})
    python: Optional[str] = field(default=None, metadata={
        "help": "the Python (with snakemake importable) that runs the job on the node "
                "(default: the one running Snakemake)", "env_var": False, "required": False})


@dataclass(frozen=True, slots=True)
class Resolved:
    """The settings checked and read (files and variables included)."""

    database_url: str
    cluster: str | None
    labels: dict[str, str]
    policy: dict[str, Any]
    ignore: frozenset[str]
    python: str | None


def resolve(settings: ExecutorSettings | None, environ: dict[str, str]) -> Resolved:
    """Check and read the settings; MappingError says what is wrong."""
    url = settings.database_url if settings is not None else None
    for name in DATABASE_URL_VARIABLES:
        url = url or environ.get(name) or None
    if not url:
        raise MappingError("the dispatch executor needs the daemon's database: "
                           "--dispatch-database-url or $DISPATCH_DATABASE_URL")
    user_policy: dict[str, Any] | None = None
    if settings is not None and settings.policy:
        try:
            user_policy = json.loads(Path(settings.policy).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise MappingError(f"--dispatch-policy {settings.policy}: {exc}") from None
        if not isinstance(user_policy, dict):
            raise MappingError(f"--dispatch-policy {settings.policy}: not a JSON object")
    ignore = (settings.ignore_resources or "") if settings is not None else ""
    python = settings.python if settings is not None else None
    if python and not os.path.isabs(python):
        raise MappingError(f"--dispatch-python {python}: must be an absolute path")
    return Resolved(
        database_url=url,
        cluster=(settings.cluster or None) if settings is not None else None,
        labels=parse_labels(settings.labels if settings is not None else None),
        policy=job_policy(user_policy),
        ignore=frozenset(filter(None, (k.strip() for k in ignore.replace(",", " ").split()))),
        python=python or None,
    )
