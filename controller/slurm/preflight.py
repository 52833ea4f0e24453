"""Preflight: probe one cluster for what it supports (``capabilities.Capabilities``).

``Preflight`` (a part of ``SlurmAdapter``) runs the probes -- version, configuration,
accounting, ``squeue --me``, whether ``output.dir`` is writable, the required commands,
and which identity the cluster supports (``squeue -O SLUID``, ``sacct -o SLUID``) -- and
interprets them with ``controller.slurm.capabilities``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import asdict
from typing import Any

from controller.errors import TransientError
from controller.slurm import script
from controller.slurm.base import AdapterBase
from controller.slurm.capabilities import (
    REQUIRED_COMMANDS,
    SUPPORTED_MAX,
    SUPPORTED_MIN,
    Capabilities,
    config_int,
    config_value,
    identity_for,
    parse_show_config,
    parse_slurm_version,
    preflight_problems,
)
from controller.slurm.dialects import utc_text
from controller.slurm.failures import slurm_failure

log = logging.getLogger(__name__)


class Preflight(AdapterBase):
    """Preflight of one cluster (module docstring)."""

    async def preflight(self) -> Capabilities:
        """Probe the cluster: version, configuration, accounting, ``squeue --me``, whether
        ``output.dir`` is writable, and which identity it supports (``squeue -O SLUID``
        and ``sacct -o SLUID`` accepted or refused: ``identity_for``). Also becomes
        ``self.capabilities`` (only when every probe answered; a failure raises and keeps
        the last). A transient sacct failure (slurmdbd down) keeps what the last
        Preflight found about accounting: it never turns accounting off."""
        warnings: list[str] = []
        out_dir = script.check_output_dir(self._settings.output_dir)
        probe = (f"D={script.shell_path(out_dir)}\n"
                 f"for c in {' '.join(REQUIRED_COMMANDS)}; do command -v \"$c\" >/dev/null"
                 " || echo \"missing $c\"; done\n"
                 'mkdir -p -- "$D" && P="$D/.dispatch-preflight.$$" && '
                 "printf 'probe\\n' >\"$P\" && rm -f -- \"$P\"\n")
        version_res, config_res, whoami_res, dir_res, sluid_res = await asyncio.gather(
            self._checked_run(["sinfo", "--version"], "sinfo --version"),
            self._checked_run(["scontrol", "show", "config"], "scontrol show config"),
            self._run(["squeue", "--me", "-h", "-o", "%i"]),
            self._runner.run_script(probe, timeout=self._timeout),
            # 24.11 and 22.05 refuse the field with a message on stderr, exit status 0
            self._run(["squeue", "--me", "-h", "-O", "JobID:|,SLUID:|"]))
        squeue_sluid = sluid_res.ok and "invalid" not in sluid_res.stderr.lower()
        version = parse_slurm_version(version_res.stdout)
        slurm_version = f"{version[0]}.{version[1]:02d}.{version[2]}"
        if not SUPPORTED_MIN <= version[:2] <= SUPPORTED_MAX:
            warnings.append(f"Slurm {slurm_version} is outside the supported 22.05 .. 26.05")
        config = parse_show_config(config_res.stdout)
        storage = config_value(config, "AccountingStorageType") or ""
        flags = (config_value(config, "AccountingStoreFlags") or "").split(",")
        accounting = False
        sacct_sluid = False
        if storage.endswith("slurmdbd"):
            since = utc_text(self._now() - 3600)
            probe_res = await self._run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,SLUID",
                                         "-S", since])
            sacct_sluid = probe_res.ok
            if not probe_res.ok and "invalid field" in probe_res.stderr.lower():
                probe_res = await self._run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw",
                                             "-S", since])  # before 24.11: no SLUID
            accounting = probe_res.ok
            if not accounting:
                failure = slurm_failure(probe_res, operation="sacct")
                before = self.capabilities
                if isinstance(failure, TransientError):
                    # slurmdbd down for now: what the last Preflight found still holds
                    # (never turn accounting off on a transient failure)
                    accounting = before.accounting_history if before is not None else True
                    sacct_sluid = before.sacct_sluid if before is not None else False
                    warnings.append("sacct does not answer for now (kept accounting "
                                    f"{'on' if accounting else 'off'}): "
                                    f"{' '.join(probe_res.stderr.split())[:200]}")
                else:
                    warnings.append("sacct does not answer: jobs that leave squeue cannot "
                                    "be observed "
                                    f"({' '.join(probe_res.stderr.split())[:200]})")
        else:
            warnings.append(f"no accounting ({storage or 'none'}): a job that leaves squeue "
                            "after MinJobAge cannot be observed")
        job_comment = "job_comment" in [flag.strip() for flag in flags]
        if accounting and not job_comment:
            warnings.append("AccountingStoreFlags lacks job_comment: finished jobs read from "
                            "sacct have unknown submission and attempt")
        min_job_age = config_int(config, "MinJobAge")
        if min_job_age is not None and min_job_age < 60 and not accounting:
            warnings.append(f"MinJobAge={min_job_age}s without accounting: ended jobs vanish "
                            "before a tick may see them")
        missing = tuple(line.split(" ", 1)[1] for line in dir_res.stdout.splitlines()
                        if line.startswith("missing "))
        if missing:
            warnings.append("missing on the Slurm host: " + ", ".join(missing))
        slurm_user = re.fullmatch(r".*\(([0-9]+)\)", config_value(config, "SlurmUser") or "")
        requeue_text = config_value(config, "JobRequeue")
        cluster_name = config_value(config, "ClusterName")
        if cluster_name is not None and cluster_name != self.cluster:
            warnings.append(f"the cluster calls itself {cluster_name!r}, configured as "
                            f"{self.cluster!r}")
        if not whoami_res.ok:
            warnings.append("squeue --me fails: "
                            + " ".join(whoami_res.stderr.split())[:200])
        if not dir_res.ok:
            warnings.append(f"output.dir {out_dir} is not writable on the Slurm host: "
                            + " ".join(dir_res.stderr.split())[:200])
        capabilities = Capabilities(
            slurm_version=slurm_version,
            accounting_history=accounting,
            job_comment=job_comment,
            min_job_age=min_job_age,
            max_job_id=config_int(config, "MaxJobId"),
            first_job_id=config_int(config, "FirstJobId"),
            job_requeue=None if requeue_text is None else requeue_text.strip() == "1",
            max_batch_requeue=config_int(config, "MaxBatchRequeue"),
            whoami=whoami_res.ok,
            output_dir_writable=dir_res.ok,
            cluster_name=cluster_name,
            warnings=tuple(warnings),
            slurm_user_uid=int(slurm_user.group(1)) if slurm_user else None,
            missing_commands=missing,
            identity=identity_for(version, squeue_sluid=squeue_sluid,
                                  sacct_sluid=sacct_sluid),
            squeue_sluid=squeue_sluid,
            sacct_sluid=sacct_sluid,
        )
        self.capabilities = capabilities
        return capabilities

    async def check_preflight(self) -> list[str]:
        """Preflight, then what the daemon needs and the cluster lacks
        (``preflight_problems``): the shape ``daemon.service`` calls at start and on
        gaining leadership. What it found is logged."""
        caps = await self.preflight()
        log.info("preflight: what the cluster supports", extra={"capabilities": asdict(caps)})
        return preflight_problems(caps)

    async def preflight_report(self) -> tuple[dict[str, Any], list[str]]:
        """Preflight as ``dispatchctl preflight`` shows it: what the cluster supports (a
        plain dict) and what the daemon needs and it lacks."""
        caps = await self.preflight()
        return {"kind": "slurm", **asdict(caps)}, preflight_problems(caps)
