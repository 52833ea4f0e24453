"""The daemon commands: ``run`` (the reconciling daemon) and ``migrate`` (the schema)."""

from __future__ import annotations

import argparse
import asyncio

from controller.cli.base import EXIT_OK, Command, Streams, config_of, open_client
from controller.errors import ErrInvalid
from controller.model.setting import redact_url


def _configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--migrate", action="store_true",
                        help="upgrade the database schema before starting")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def _run(args: argparse.Namespace, streams: Streams) -> int:
    from controller import wiring
    from controller.daemon.service import Daemon

    wiring.setup_logging(args.log_level)
    config = config_of(args)
    with open_client(config, schema=False) as client:
        if args.migrate:
            client.migrate()
        elif client.schema_revision() is None:
            raise ErrInvalid("the database has no schema yet: run 'dispatchctl migrate' "
                             "first (or 'dispatchctl run --migrate')", field="database")
    parts = wiring.build_all(config)
    daemon = Daemon(config, store=parts.store, metrics=parts.metrics, shards=parts.shards)

    async def main() -> None:
        try:
            await daemon.run()
        finally:
            await parts.close()

    asyncio.run(main())
    return EXIT_OK


def _configure_migrate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--revision", default="head", help="target revision (default head)")


def _migrate(args: argparse.Namespace, streams: Streams) -> int:
    config = config_of(args)
    with open_client(config, schema=False) as client:
        revision = client.migrate(args.revision)
    print(f"database {redact_url(config.database.url)} at revision {revision}",
          file=streams.stdout)
    return EXIT_OK


COMMANDS: dict[str, Command] = {
    "run": Command("run the reconciling daemon", _configure_run, _run),
    "migrate": Command("create or upgrade the database schema", _configure_migrate, _migrate),
}
