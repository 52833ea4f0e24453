"""Wiring at the top: build the runner, the adapter, the store and the daemon from a Config.

The only module that knows every concrete class; everything below it takes its
collaborators as arguments.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from controller.config import ClusterEntry, Config, SchedulerKind, TransportKind
from controller.daemon.service import build_shard, shard_lease
from controller.daemon.shard import Shard
from controller.gridengine import script as ge_script
from controller.gridengine.adapter import GridEngineAdapter
from controller.metrics import Metrics
from controller.model.obs import ObjectRef, StartRequest
from controller.reconcile.ports import SchedulerPort
from controller.runner.base import RateLimiter, Runner
from controller.runner.local import LocalRunner
from controller.slurm import script as slurm_script
from controller.slurm.adapter import SlurmAdapter
from controller.store.db import Store
from controller.store.lease import new_holder_id

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    """``ts level logger message key=value ...``: a fixed message plus structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        parts = [ts, record.levelname.lower(), record.name, json.dumps(record.getMessage())]
        parts += [f"{k}={json.dumps(v, default=str, sort_keys=True)}" for k, v in fields.items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def slurm_user(cluster: ClusterEntry) -> str:
    t = cluster.transport
    if t.kind is TransportKind.SSH:
        return t.user or getpass.getuser()
    return t.run_as or getpass.getuser()


def build_runner(cluster: ClusterEntry, *,
                 observer: Callable[[str, float, bool], None] | None = None) -> Runner:
    """The transport to one cluster, with that cluster's own rate budget."""
    t = cluster.transport
    rate = cluster.slurm.rate_per_s
    limiter = RateLimiter(rate=rate, burst=max(1, int(rate)))
    if t.kind is TransportKind.SSH:
        # (imported here: a daemon on the local transport never loads asyncssh)
        from controller.runner.ssh import SSHRunner

        assert t.host is not None
        known_hosts = t.known_hosts or str(Path("~/.ssh/known_hosts").expanduser())
        keys = [os.path.expanduser(t.key_file)] if t.key_file else []
        return SSHRunner(t.host, port=t.port, username=slurm_user(cluster), client_keys=keys,
                         known_hosts=known_hosts, default_timeout=t.command_timeout_s,
                         observer=observer, limiter=limiter)
    return LocalRunner(run_as=t.run_as, default_timeout=t.command_timeout_s,
                       observer=observer, limiter=limiter)


class Adapter(SchedulerPort, Protocol):
    """What wiring and the CLI use of any adapter besides the port: Preflight (what the
    cluster supports; the problems the daemon cannot run with) and Output."""

    async def check_preflight(self) -> list[str]: ...

    async def preflight_report(self) -> tuple[dict[str, Any], list[str]]: ...

    def output(self, ref: ObjectRef, stream: Literal["stdout", "stderr"], *,
               follow: bool = False, submission: int) -> AsyncIterator[bytes]: ...


def _slurm(cluster: ClusterEntry, runner: Runner, clock: Callable[[], float],
           write_guard: Callable[[], None] | None) -> Adapter:
    return SlurmAdapter(runner, cluster=cluster.name, settings=cluster.start_settings(),
                        user=slurm_user(cluster), clock=clock,
                        command_timeout=cluster.transport.command_timeout_s,
                        write_guard=write_guard)


def _gridengine(cluster: ClusterEntry, runner: Runner, clock: Callable[[], float],
                write_guard: Callable[[], None] | None) -> Adapter:
    return GridEngineAdapter(runner, cluster=cluster.name, settings=cluster.start_settings(),
                             user=slurm_user(cluster), ge=cluster.gridengine.settings(),
                             accounting_file=cluster.gridengine.accounting_file,
                             unheard_grace_s=cluster.gridengine.unheard_grace_s,
                             clock=clock, command_timeout=cluster.transport.command_timeout_s,
                             write_guard=write_guard)


# One adapter per scheduler kind: a cluster entry's ``kind`` chooses its row.
ADAPTERS: Final[Mapping[SchedulerKind, Callable[
    [ClusterEntry, Runner, Callable[[], float], Callable[[], None] | None], Adapter]]] = {
    SchedulerKind.SLURM: _slurm,
    SchedulerKind.GRIDENGINE: _gridengine,
}


# The Start script of each kind, as ``dispatchctl submit --dry-run`` prints it.
START_SCRIPTS: Final[Mapping[SchedulerKind, Callable[[ClusterEntry, StartRequest], str]]] = {
    SchedulerKind.SLURM: lambda cluster, request: slurm_script.render_start_script(
        request, cluster.start_settings()),
    SchedulerKind.GRIDENGINE: lambda cluster, request: ge_script.render_start_script(
        request, cluster.start_settings(), cluster.gridengine.settings()),
}


def render_start(cluster: ClusterEntry, request: StartRequest) -> str:
    """The exact script Start would run on ``cluster`` for ``request``."""
    return START_SCRIPTS[cluster.kind](cluster, request)


def build_adapter(cluster: ClusterEntry, runner: Runner, *,
                  clock: Callable[[], float] = time.time,
                  write_guard: Callable[[], None] | None = None) -> Adapter:
    """The adapter of the cluster's scheduler kind (``ADAPTERS``)."""
    return ADAPTERS[cluster.kind](cluster, runner, clock, write_guard)


def build_store(config: Config) -> Store:
    # a stopped leader's open transaction (and its lock on the lease row) is ended by the
    # server well before its lease expires, so the standby is never blocked behind it
    return Store(config.database.url, idle_tx_timeout_s=config.daemon.lease_ttl_s / 2)


@dataclass(slots=True)
class Parts:
    """The daemon's parts: one store and registry, and per cluster a runner and a shard
    whose adapter's every Slurm write is guarded by that shard's lease."""

    metrics: Metrics
    store: Store
    runners: list[Runner]
    shards: list[Shard]

    async def close(self) -> None:
        for runner in self.runners:
            await runner.close()


def build_all(config: Config) -> Parts:
    metrics = Metrics(cluster=config.default_cluster.name)
    store = build_store(config)
    runners: list[Runner] = []
    shards: list[Shard] = []
    holder = new_holder_id()  # this replica, in every lease it holds
    for cluster in config.clusters:
        view = metrics.for_cluster(cluster.name)
        runner = build_runner(cluster, observer=view.observe_command)
        lease = shard_lease(config, cluster.name, store, holder=holder)
        adapter = build_adapter(cluster, runner, write_guard=lease.guard)
        runners.append(runner)
        shards.append(build_shard(config, cluster.name, store=store, adapter=adapter,
                                  metrics=view, lease=lease,
                                  preflight=adapter.check_preflight))
    return Parts(metrics, store, runners, shards)
