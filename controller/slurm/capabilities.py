"""What one cluster supports, from Preflight: ``Capabilities``, the Slurm versions
supported, the identity a cluster offers (``identity_for``), what the daemon needs and
the cluster lacks (``preflight_problems``), and the parsing of what Preflight reads
(``sinfo --version``, ``scontrol show config``). Pure: ``controller.slurm.preflight``
runs the probes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from controller.errors import ProtocolError

SUPPORTED_MIN: Final = (22, 5)
SUPPORTED_MAX: Final = (26, 5)
_VERSION = re.compile(r"(?:slurm(?:-wlm)?\s+)?([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What Preflight found on one cluster (SPEC §4.4; slurm-reference §4.8).

    Every version is read through the same text forms (``controller.slurm.adapter``): nothing here
    chooses a reader. ``accounting_history`` is true when sacct answered; ``job_comment``
    when ``AccountingStoreFlags`` keeps the comment, so a finished job's submission and
    attempt are known. ``None`` means the cluster did not say.
    """

    slurm_version: str
    accounting_history: bool = False
    job_comment: bool = False
    min_job_age: int | None = None
    max_job_id: int | None = None
    first_job_id: int | None = None
    job_requeue: bool | None = None
    max_batch_requeue: int | None = None
    whoami: bool = False
    output_dir_writable: bool = False
    cluster_name: str | None = None
    warnings: tuple[str, ...] = ()
    slurm_user_uid: int | None = None  # SlurmUser's uid: its cancels are Slurm's own
    missing_commands: tuple[str, ...] = ()  # Slurm commands the host does not have
    # How a job is told apart from a later one with the same id (IDENTITY_*): "sluid"
    # (26.05+: squeue prints the SLUID and scancel/scontrol take it: every write names
    # the job by it), "sluid-accounting" (24.11: sacct records it, 25.11: squeue too; read
    # and recorded, never written by), "id+name+submit" (22.05: SPEC §2's check only).
    identity: str = "id+name+submit"
    squeue_sluid: bool = False  # ``squeue -O SLUID`` accepted (probed)
    sacct_sluid: bool = False  # ``sacct -o SLUID`` accepted (probed)

    @property
    def version(self) -> tuple[int, int, int]:
        return parse_slurm_version(self.slurm_version)


IDENTITY_SLUID: Final = "sluid"
IDENTITY_SLUID_ACCOUNTING: Final = "sluid-accounting"
IDENTITY_CLASSIC: Final = "id+name+submit"
# scancel and scontrol take a SLUID from 26.05 (Slurm's changelog; tried on 26.05.5).
SLUID_WRITES_SINCE: Final = (26, 5)


def identity_for(version: tuple[int, int, int], *, squeue_sluid: bool,
                 sacct_sluid: bool) -> str:
    """The identity a cluster supports, from what Preflight probed (the SLUID: see
    ``controller.slurm.adapter``)."""
    if squeue_sluid and version[:2] >= SLUID_WRITES_SINCE:
        return IDENTITY_SLUID
    if squeue_sluid or sacct_sluid:
        return IDENTITY_SLUID_ACCOUNTING
    return IDENTITY_CLASSIC


# The commands the daemon runs on the Slurm host (sinfo and scontrol are checked by running
# them in preflight itself).
REQUIRED_COMMANDS: Final = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")


def preflight_problems(caps: Capabilities) -> list[str]:
    """What the daemon needs and the cluster lacks, from Preflight's findings; empty when
    it can run. Pure: the daemon calls it at start and on gaining leadership, and
    ``dispatchctl preflight`` exits non-zero when it is not empty.

    Needed: a supported Slurm version; every command of ``REQUIRED_COMMANDS``; ``squeue
    --me`` (every read of the queue uses it); a writable ``output.dir`` (every Start writes
    its manifest there). Not needed (warnings only): accounting (jobs that leave squeue end
    unknown after a grace window instead of with their outcome), ``job_comment``, a
    cluster name that differs from the configured one.
    """
    problems: list[str] = []
    try:
        version = caps.version
    except ProtocolError:
        problems.append(f"unreadable Slurm version {caps.slurm_version!r}")
    else:
        if not SUPPORTED_MIN <= version[:2] <= SUPPORTED_MAX:
            problems.append(f"Slurm {caps.slurm_version} is outside the supported "
                            "22.05 .. 26.05")
    if caps.missing_commands:
        problems.append("missing on the Slurm host: " + ", ".join(caps.missing_commands))
    if not caps.whoami:
        problems.append("squeue --me does not work: the daemon cannot read its jobs")
    if not caps.output_dir_writable:
        problems.append("output.dir is not writable on the Slurm host: Start cannot write "
                        "its manifest")
    return problems


def parse_slurm_version(text: str) -> tuple[int, int, int]:
    """``(22, 5, 8)`` from ``22.05.8``, ``slurm 25.11.0`` or ``slurm-wlm 22.05.8``."""
    match = _VERSION.search(text.strip())
    if match is None:
        raise ProtocolError(f"not a Slurm version: {text.strip()!r:.80}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)



def config_value(config: dict[str, str], key: str) -> str | None:
    value = config.get(key)
    if value is None or value in ("(null)", "N/A", ""):
        return None
    return value


def config_int(config: dict[str, str], key: str) -> int | None:
    value = config_value(config, key)
    if value is None:
        return None
    match = re.match(r"([0-9]+)", value)
    return int(match.group(1)) if match else None


def parse_show_config(text: str) -> dict[str, str]:
    """``Key = Value`` lines of ``scontrol show config``."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config
