"""Reading the documents ``dispatchctl`` is given: a job (JSON or YAML, ``-`` for stdin),
validated once into a ``JobDocument``, and a recovery policy."""

from __future__ import annotations

import json
import re
import sys
from typing import Any, TextIO

from controller.cli.base import Streams
from controller.errors import ErrInvalid
from controller.model.spec import JobDocument, JobSpec

_SECRET_NAME_RE = re.compile(r"PASSWORD|SECRET|TOKEN|KEY|CREDENTIAL", re.IGNORECASE)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ErrInvalid("appears twice in one object", field=key)
        out[key] = value
    return out


def read_document(path: str, *, stdin: TextIO | None = None) -> object:
    """The decoded document at ``path`` (``-`` = stdin); ErrInvalid names the file.

    JSON (a key given twice is refused), or YAML when the name ends ``.yaml``/``.yml``
    and PyYAML is installed."""
    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise ErrInvalid(f"cannot read: {exc.strerror or exc}", field=path) from exc
    except UnicodeDecodeError as exc:
        raise ErrInvalid("is not UTF-8 text", field=path) from exc
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # optional dependency
        except ImportError as exc:
            raise ErrInvalid("reading YAML needs PyYAML; use JSON or install PyYAML",
                             field=path) from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ErrInvalid(f"is not valid YAML: {exc}", field=path) from exc
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ErrInvalid(f"is not valid JSON: {exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}", field=path) from exc


def read_job(path: str, streams: Streams) -> JobDocument:
    """The job document at ``path``, validated (the only time), with a warning per env
    name that looks like a secret."""
    job = JobDocument.parse(read_document(path))
    for name in secret_looking_env(job.spec):
        streams.warn(f"env.{name} looks like a secret; env values are stored in the job "
                     "script by slurmctld")
    return job


def read_policy(path: str) -> dict[str, Any]:
    """A recovery policy document (validated where it is written: ``repo.insert_job``)."""
    raw = read_document(path)
    if not isinstance(raw, dict):
        raise ErrInvalid("must be a JSON object", field=path)
    return raw


def secret_looking_env(spec: JobSpec) -> list[str]:
    """Env names that look like secrets (their values end up in a script slurmctld keeps)."""
    return [name for name, _ in spec.env if _SECRET_NAME_RE.search(name)]
