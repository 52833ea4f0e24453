"""What one Grid Engine cluster supports, from Preflight, and what the daemon needs and
it lacks (``preflight_problems``); the parsing of what Preflight reads (``qstat
-help``'s first line, ``qconf -sconf``, ``qconf -sql``). Pure.

Grid Engine lacks, whatever its configuration (``LACKS``, shown by ``dispatchctl
preflight``): a restart count (a rescheduled job only says ``RESTARTED=1``); telling
a ``qdel`` from any other signal in accounting (both ``failed 100``); an out-of-memory
cause (``h_vmem`` is a per-process limit, or ``failed 37`` like a time limit); a
per-job grace period before a stop; requeue by its owner (``qmod -rj`` needs a
rerunnable job and operator rights); jobs on several nodes and GPUs (refused at Start).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from controller.errors import ProtocolError

SUPPORTED: Final = ((8, 1),)  # Son of Grid Engine 8.1.x (Debian 12's 8.1.9)
LACKS: Final = ("restart-count", "cancel-provenance", "out-of-memory-cause", "stop-grace",
                "requeue", "multi-node", "gpus")
REQUIRED_COMMANDS: Final = ("qsub", "qstat", "qdel", "qhold", "qrls", "qalter", "qconf")
_VERSION = re.compile(r"(?:SGE|GE|OGS/GE|Univa Grid Engine)\s+([0-9]+)\.([0-9]+)\.([0-9]+)")
_DURATION = re.compile(r"([0-9]+):([0-9]{2}):([0-9]{2})")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What Preflight found on one Grid Engine cluster (None: it did not say)."""

    version: str
    accounting_file: str
    accounting_readable: bool = False
    min_uid: int | None = None
    submit_uid: int | None = None
    queues: tuple[str, ...] = ()
    queue_configured: str = ""
    max_unheard_s: int | None = None
    reschedule_unknown_s: int | None = None
    forced_qdel_unknown: bool = False  # qdel -f allowed for a job on an unknown host
    accounting_flush_s: int | None = None
    output_dir_writable: bool = False
    missing_commands: tuple[str, ...] = ()
    lacks: tuple[str, ...] = LACKS
    warnings: tuple[str, ...] = ()
    kind: str = "gridengine"


def parse_version(text: str) -> tuple[int, int, int]:
    """``SGE 8.1.9`` (``qstat -help``'s first line) as numbers."""
    match = _VERSION.search(text)
    if match is None:
        raise ProtocolError(f"qstat -help: no version in {text[:80]!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def parse_sconf(text: str) -> dict[str, str]:
    """``qconf -sconf``: ``name value`` lines, ``\\``-continued lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found: dict[str, str] = {}
    for line in joined.splitlines():
        name, _, value = line.strip().partition(" ")
        if name and not name.startswith("#"):
            found[name] = value.strip()
    return found


def duration_s(text: str | None) -> int | None:
    """``00:05:00`` as seconds (None when absent or not of that shape)."""
    if text is None:
        return None
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        return None
    return int(match.group(1)) * 3600 + int(match.group(2)) * 60 + int(match.group(3))


def flush_s(reporting_params: str | None) -> int | None:
    """The accounting flush time: ``accounting_flush_time``, else ``flush_time``."""
    if reporting_params is None:
        return None
    params = dict(word.partition("=")[::2] for word in reporting_params.split())
    return duration_s(params.get("accounting_flush_time") or params.get("flush_time"))


def preflight_problems(caps: Capabilities) -> list[str]:
    """What the daemon needs and this cluster lacks (each a reason not to run)."""
    problems: list[str] = []
    if not caps.accounting_readable:
        problems.append(f"the accounting file {caps.accounting_file} is not readable on the "
                        "submit host: a job that leaves qstat could never be observed")
    if caps.missing_commands:
        problems.append("missing on the submit host: " + ", ".join(caps.missing_commands))
    if not caps.output_dir_writable:
        problems.append("output.dir is not writable on the submit host")
    if (caps.min_uid is not None and caps.submit_uid is not None
            and caps.submit_uid < caps.min_uid):
        problems.append(f"the submit user's uid {caps.submit_uid} is below min_uid "
                        f"{caps.min_uid}: Grid Engine refuses its jobs")
    if caps.queue_configured and caps.queue_configured not in caps.queues:
        problems.append(f"gridengine.queue {caps.queue_configured} is not a queue of the "
                        f"cluster ({', '.join(caps.queues) or 'none'})")
    if not caps.queues:
        problems.append("the cluster has no queue (qconf -sql)")
    return problems
