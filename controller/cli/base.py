"""What every command group of ``dispatchctl`` shares: the command row, the streams a
handler writes to, the exit statuses, the configuration and the database client.

Exit status (README): 0 success; 1 failure -- a job that is not there, a job that did not
succeed (``wait``), a cluster lacking what the daemon needs (``preflight``), or a database
or Slurm host that cannot be reached (one line, ``dispatchctl: error: database
unavailable: <reason>``); 2 bad input (the command line, a document, the configuration:
one line naming the field); 3 ``wait`` on a job that failed with a warning.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from controller.client import Client
from controller.config import Config, load_config

PROG = "dispatchctl"
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
# ``dispatchctl wait``: the job failed with a warning (its recovery budget spent under
# ``on_exhausted: warn``): the workflow may go on
EXIT_WARNING = 3


class UsageError(Exception):
    """The command line itself is wrong (argparse's complaint, as one line)."""


@dataclass(frozen=True, slots=True)
class Streams:
    """Where a handler writes; injected so tests need no global capture."""

    stdout: TextIO
    stderr: TextIO

    def warn(self, message: str) -> None:
        print(f"{PROG}: warning: {message}", file=self.stderr)


Handler = Callable[[argparse.Namespace, Streams], int]


@dataclass(frozen=True, slots=True)
class Command:
    """One row of the command table: ``configure`` adds its arguments (every command also
    gets ``--config FILE``), ``handler(args, streams)`` returns the exit status."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    handler: Handler


def config_of(args: argparse.Namespace) -> Config:
    """The configuration ``--config`` names (default: the built-in defaults)."""
    path: str | None = args.config
    return load_config(path)


@contextmanager
def open_client(config: Config, *, schema: bool = True) -> Iterator[Client]:
    """A database client, closed on the way out; with ``schema`` (the default) the schema
    must exist already (``dispatchctl migrate``)."""
    client = Client(config.database.url)
    try:
        if schema:
            client.require_schema()
        yield client
    finally:
        client.close()
