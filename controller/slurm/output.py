"""Output: a submission's execution files read by offset on the Slurm host, and which
paths exist there.

``Outputs`` (a part of ``SlurmAdapter``) reads the manifest ``D/s<N>.manifest``, lists
the execution files of the job under its prefix and suffix (r10 after r9) and yields
their new bytes, following the job until it ends; ``started_evidence`` and
``missing_paths`` ask whether files exist. The sh scripts and the reading of what they
print are ``controller.slurm.output_scripts``.
"""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator, Sequence
from typing import Literal

from controller.errors import ErrInvalid, ErrNotFound, ProtocolError, TransientError
from controller.model.obs import ObjectRef, State
from controller.slurm import naming, output_scripts, script
from controller.slurm.failures import slurm_failure
from controller.slurm.reads import Reads

Stream = Literal["stdout", "stderr"]


class Outputs(Reads):
    """Output and file checks of one cluster (module docstring)."""

    _poll_interval: float

    async def output(self, ref: ObjectRef, stream: Stream, *, follow: bool = False,
                     submission: int) -> AsyncIterator[bytes]:
        """The bytes of one stream of ``ref``'s executions, in restart order (SPEC §3.4).

        Reads the manifest ``D/s<N>.manifest``, lists the execution files of ``ref.id``
        under its prefix and suffix (r10 after r9) and yields their contents. With
        ``follow`` it polls every ``poll_interval`` seconds for new bytes and new
        executions until the job has ended (then reads once more and stops).
        """
        if stream not in ("stdout", "stderr"):
            raise ErrInvalid("must be stdout or stderr", field="stream")
        job_id = naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a discovery name: {ref.uid!r:.60}", field="ref.uid")
        manifest = script.manifest_path(self._settings, job_id, submission)
        text = await self._cat(manifest)
        if not text.endswith("\n"):  # a Start writing it this instant (script.py)
            raise TransientError(f"output: the manifest {manifest} is being written")
        stdout_files, stderr_files = script.parse_manifest(text)
        files = stdout_files if stream == "stdout" else stderr_files
        directory, prefix = files.locate(posixpath.dirname(manifest))
        offsets: dict[str, int] = {}
        while True:
            ended = await self._output_finished(ref) if follow else True
            more = True
            while more:
                chunks, more = await self._read_new(directory, prefix, files.suffix,
                                                    ref.id, offsets)
                for chunk in chunks:
                    yield chunk
            if ended:
                return
            await self._sleep(self._poll_interval)

    async def _cat(self, path: str) -> str:
        result = await self._runner.run_script(
            output_scripts.cat_script(path), timeout=self._timeout)
        if not result.ok:
            if "No such file" in result.stderr:
                raise ErrNotFound(f"output: no manifest {path}")
            raise slurm_failure(result, operation=f"cat {path}")
        return result.stdout

    async def _output_finished(self, ref: ObjectRef) -> bool:
        try:
            return (await self.inspect(ref)).state is State.ENDED
        except ErrNotFound:
            return True
        except ProtocolError:
            return False  # sacct says it is still pending/running


    async def _read_new(self, directory: str, prefix: str, suffix: str, slurm_id: int,
                        offsets: dict[str, int]) -> tuple[list[bytes], bool]:
        """New bytes of every execution file of ``slurm_id``, in restart order; and
        whether a file has more than one chunk still to read."""
        text = output_scripts.read_new_script(directory, prefix, suffix, offsets)
        result = await self._runner.run_script(text, timeout=self._timeout)
        if not result.ok:
            raise slurm_failure(result, operation=f"output of job {slurm_id}")
        return output_scripts.take_new_bytes(result.stdout, prefix=prefix, suffix=suffix,
                                             slurm_id=slurm_id, offsets=offsets)

    # ------------------------------------------------------------ paths

    async def started_evidence(self, ref: ObjectRef, submission: int) -> bool:
        """Whether ``ref``'s object of ``submission`` ever started: slurmstepd creates its
        ``--output`` file (``D/s<N>-<id>.slurm``, script.py) when the batch step starts, so
        its absence says it never ran -- given that ``output.dir`` is the same file system
        on the nodes and here, which ``logs`` needs as well."""
        job_id = naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a dispatch name: {ref.uid!r:.60}", field="ref.uid")
        path = posixpath.join(script.output_dir(self._settings, job_id),
                              f"s{submission}-{ref.id}.slurm")
        return not await self.missing_paths([path])

    async def missing_paths(self, paths: Sequence[str]) -> list[str]:
        """The paths that do not exist on the Slurm host (one sh script per ~60 KB)."""
        missing: list[str] = []
        for start, end, text in output_scripts.missing_paths_scripts(paths):
            result = await self._runner.run_script(text, timeout=self._timeout)
            if not result.ok:
                raise slurm_failure(result, operation="missing_paths")
            missing.extend(paths[start + index]
                           for index in output_scripts.missing_indexes(result.stdout,
                                                                       end - start))
        return missing

    # ------------------------------------------------------------ ownership marker

    async def owner_marker(self, deployment: str) -> str | None:
        """The token of ``deployment``'s ownership marker of this cluster on the Slurm
        host (``<output.dir>/.owners/<deployment>@<cluster>``), or None when there is
        none."""
        result = await self._runner.run_script(
            output_scripts.owner_read_script(self._settings.output_dir, deployment,
                                             self.cluster),
            timeout=self._timeout)
        if not result.ok:
            raise slurm_failure(result, operation="read the ownership marker")
        return output_scripts.owner_token(result.stdout)

    async def set_owner_marker(self, deployment: str, token: str) -> None:
        """Write ``deployment``'s ownership marker (a write: behind the write guard)."""
        text = output_scripts.owner_write_script(self._settings.output_dir, deployment,
                                                 self.cluster, token)
        self._guard_write()
        result = await self._runner.run_script(text, timeout=self._timeout)
        if not result.ok:
            raise slurm_failure(result, operation="write the ownership marker")
