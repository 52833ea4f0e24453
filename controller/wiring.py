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
    limiter = RateLimiter(rate=config.daemon.slurm_rate_per_s,
                          burst=max(1, int(config.daemon.slurm_rate_per_s)))
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
                  clock: Callable[[], float] = time.time) -> SlurmAdapter:
    return SlurmAdapter(runner, cluster=config.cluster.name, settings=config.start_settings(),
                        user=slurm_user(config), clock=clock,
                        command_timeout=config.transport.command_timeout_s)


def build_store(config: Config) -> Store:
    return Store(config.database.url)


def build_all(config: Config) -> dict[str, Any]:
    metrics = Metrics()
    runner = build_runner(config, observer=metrics.observe_command)
    adapter = build_adapter(config, runner)
    return {"metrics": metrics, "runner": runner, "adapter": adapter,
            "store": build_store(config)}
