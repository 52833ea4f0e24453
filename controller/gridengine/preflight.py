"""Preflight: what one cell supports (``capabilities.Capabilities``) and what the daemon
needs and it lacks.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from dataclasses import asdict
from typing import Any

from controller.gridengine import (
    capabilities,
)
from controller.gridengine.base import AdapterBase
from controller.gridengine.capabilities import Capabilities
from controller.slurm.script import check_output_dir

log = logging.getLogger(__name__)


class Preflight(AdapterBase):
    """Preflight of one cell (module docstring)."""

    # ------------------------------------------------------------ preflight

    async def preflight(self) -> Capabilities:
        """Version, the global configuration (min_uid, max_unheard, reschedule_unknown,
        forced deletion, the accounting flush), the queues, whether the accounting file
        is readable and ``output.dir`` writable, the commands present."""
        out_dir = check_output_dir(self._settings.output_dir)
        from controller.slurm.script import shell_path
        probe = (f"D={shell_path(out_dir)}\n"
                 f"for c in {' '.join(capabilities.REQUIRED_COMMANDS)}; do command -v "
                 "\"$c\" >/dev/null || echo \"missing $c\"; done\n"
                 f"[ -r {shlex.quote(self._accounting_file)} ] && echo accounting-readable\n"
                 "echo \"uid $(id -u)\"\n"
                 'mkdir -p -- "$D" && P="$D/.dispatch-preflight.$$" && '
                 "printf 'probe\\n' >\"$P\" && rm -f -- \"$P\" && echo dir-writable\n"
                 "exit 0\n")
        version_res, conf_res, queues_res, probe_res = await asyncio.gather(
            self._script("qstat -help | head -n 1\n", "qstat -help"),
            self._checked(["qconf", "-sconf"], "qconf -sconf"),
            self._run(["qconf", "-sql"]),
            self._runner.run_script(probe, timeout=self._timeout))
        version = capabilities.parse_version(version_res.stdout)
        conf = capabilities.parse_sconf(conf_res.stdout)
        lines = probe_res.stdout.splitlines()
        warnings: list[str] = []
        if version[:2] not in capabilities.SUPPORTED:
            warnings.append(f"Grid Engine {'.'.join(map(str, version))} is not the tested "
                            "8.1")
        min_uid = conf.get("min_uid")
        params = conf.get("qmaster_params", "")
        forced = "ENABLE_FORCED_QDEL_IF_UNKNOWN" in params or "ENABLE_FORCED_QDEL" in params
        flush = capabilities.flush_s(conf.get("reporting_params"))
        if flush:
            warnings.append(f"accounting is flushed every {flush}s: a job that left qstat "
                            "is in neither qstat nor the file for that long")
        reschedule = capabilities.duration_s(conf.get("reschedule_unknown"))
        if not reschedule:
            warnings.append("reschedule_unknown is 0: Grid Engine keeps the jobs of a dead "
                            "host running ('r') until its execd returns")
        uid_line = next((line for line in lines if line.startswith("uid ")), "")
        caps = Capabilities(
            version=".".join(map(str, version)),
            accounting_file=self._accounting_file,
            accounting_readable="accounting-readable" in lines,
            min_uid=_number(min_uid),
            submit_uid=_number(uid_line[4:]),
            queues=tuple(queues_res.stdout.split()) if queues_res.ok else (),
            queue_configured=self._ge.queue,
            max_unheard_s=capabilities.duration_s(conf.get("max_unheard")),
            reschedule_unknown_s=reschedule,
            forced_qdel_unknown=forced,
            accounting_flush_s=flush,
            output_dir_writable="dir-writable" in lines,
            missing_commands=tuple(line.split(" ", 1)[1] for line in lines
                                   if line.startswith("missing ")),
            warnings=tuple(warnings))
        self.capabilities = caps
        return caps

    async def check_preflight(self) -> list[str]:
        caps = await self.preflight()
        log.info("preflight: what the cluster supports", extra={"capabilities": asdict(caps)})
        return capabilities.preflight_problems(caps)

    async def preflight_report(self) -> tuple[dict[str, Any], list[str]]:
        """Preflight as ``dispatchctl preflight`` shows it."""
        caps = await self.preflight()
        return asdict(caps), capabilities.preflight_problems(caps)


def _number(text: str | None) -> int | None:
    """A non-negative integer in ASCII digits, else None ("²".isdigit(): int() refuses it)."""
    return int(text) if text and text.isascii() and text.isdigit() else None
