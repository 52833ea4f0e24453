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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.config import Config, TransportKind
from controller.metrics import Metrics
from controller.runner.base import RateLimiter, Runner
from controller.runner.local import LocalRunner
from controller.runner.ssh import SSHRunner
from controller.slurm.adapter import SlurmAdapter
from controller.store.db import Store
from controller.store.lease import Lease

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


def slurm_user(config: Config) -> str:
    t = config.transport
    if t.kind is TransportKind.SSH:
        return t.user or getpass.getuser()
    return t.run_as or getpass.getuser()


def build_runner(config: Config, *, observer: Callable[[str, float, bool], None] | None = None,
                 ) -> Runner:
    t = config.transport
    limiter = RateLimiter(rate=config.slurm.rate_per_s,
                          burst=max(1, int(config.slurm.rate_per_s)))
    if t.kind is TransportKind.SSH:
        assert t.host is not None
        known_hosts = t.known_hosts or str(Path("~/.ssh/known_hosts").expanduser())
        keys = [os.path.expanduser(t.key_file)] if t.key_file else []
        return SSHRunner(t.host, port=t.port, username=slurm_user(config), client_keys=keys,
                         known_hosts=known_hosts, default_timeout=t.command_timeout_s,
                         observer=observer, limiter=limiter)
    return LocalRunner(run_as=t.run_as, default_timeout=t.command_timeout_s,
                       observer=observer, limiter=limiter)


def build_adapter(config: Config, runner: Runner, *,
                  clock: Callable[[], float] = time.time,
                  write_guard: Callable[[], None] | None = None) -> SlurmAdapter:
    return SlurmAdapter(runner, cluster=config.cluster.name, settings=config.start_settings(),
                        user=slurm_user(config), clock=clock,
                        command_timeout=config.transport.command_timeout_s,
                        write_guard=write_guard)


def build_store(config: Config) -> Store:
    # a stopped leader's open transaction (and its lock on the lease row) is ended by the
    # server well before its lease expires, so the standby is never blocked behind it
    return Store(config.database.url, idle_tx_timeout_s=config.daemon.lease_ttl_s / 2)


def build_lease(config: Config, store: Store) -> Lease:
    return Lease(store, ttl_s=config.daemon.lease_ttl_s, margin_s=config.daemon.lease_margin_s)


def build_all(config: Config) -> dict[str, Any]:
    """The daemon's parts: every Slurm write of the adapter is guarded by the lease."""
    metrics = Metrics()
    runner = build_runner(config, observer=metrics.observe_command)
    store = build_store(config)
    lease = build_lease(config, store)
    adapter = build_adapter(config, runner, write_guard=lease.guard)
    return {"metrics": metrics, "runner": runner, "adapter": adapter, "store": store,
            "lease": lease}
