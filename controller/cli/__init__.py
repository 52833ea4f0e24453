"""``dispatchctl``, the command-line client, as a package.

``app`` (the application: the command table, parsing, exit statuses) sits on the command
groups -- ``jobs`` (submit, get, describe, hold, release, cancel, wait), ``daemon`` (run,
migrate), ``slurm`` (logs, preflight), ``settings`` (config) -- which sit on
``documents`` (reading job and policy documents) and ``base`` (what they share:
``open_client``, streams, exit statuses). An import-linter contract keeps that order.
"""

from controller.cli.app import main

__all__ = ["main"]
