"""Files on the submit host: Output (the manifest and the execution files, read by offset,
as on Slurm: ``controller.slurm.output_scripts``), started_evidence (Grid Engine's own
``-o`` file), missing_paths, and the ownership marker.
"""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator, Sequence

from controller.errors import (
    ErrInvalid,
    ErrNotFound,
    TransientError,
)
from controller.gridengine.base import Stream
from controller.gridengine.reads import Reads
from controller.model.obs import ObjectRef, State
from controller.slurm import naming as slurm_naming
from controller.slurm import output_scripts
from controller.slurm.script import manifest_path, output_dir
from controller.slurm.script import parse_manifest as _parse_manifest


class Files(Reads):
    """Output and file checks of one cell (module docstring)."""

    # ------------------------------------------------------------ files

    async def missing_paths(self, paths: Sequence[str]) -> list[str]:
        missing: list[str] = []
        for start, end, text in output_scripts.missing_paths_scripts(paths):
            result = await self._script(text, "missing_paths")
            missing.extend(paths[start + index]
                           for index in output_scripts.missing_indexes(result.stdout,
                                                                       end - start))
        return missing

    async def started_evidence(self, ref: ObjectRef, submission: int) -> bool:
        """Whether ``ref``'s object ever started: the shepherd creates its ``-o`` file
        ``D/s<N>-<id>.ge`` when the job starts."""
        job_id = slurm_naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a dispatch name: {ref.uid!r:.60}", field="ref.uid")
        path = posixpath.join(output_dir(self._settings, job_id),
                              f"s{submission}-{ref.id}.ge")
        return not await self.missing_paths([path])

    async def owner_marker(self, deployment: str) -> str | None:
        result = await self._script(
            output_scripts.owner_read_script(self._settings.output_dir, deployment,
                                             self.cluster), "read the ownership marker")
        return output_scripts.owner_token(result.stdout)

    async def set_owner_marker(self, deployment: str, token: str) -> None:
        text = output_scripts.owner_write_script(self._settings.output_dir, deployment,
                                                 self.cluster, token)
        self._guard()
        await self._script(text, "write the ownership marker")

    async def output(self, ref: ObjectRef, stream: Stream, *, follow: bool = False,
                     submission: int) -> AsyncIterator[bytes]:
        """The bytes of one stream of ``ref``'s executions (as on Slurm, SPEC §3.4)."""
        if stream not in ("stdout", "stderr"):
            raise ErrInvalid("must be stdout or stderr", field="stream")
        job_id = slurm_naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a discovery name: {ref.uid!r:.60}", field="ref.uid")
        manifest = manifest_path(self._settings, job_id, submission)
        result = await self._runner.run_script(output_scripts.cat_script(manifest),
                                               timeout=self._timeout)
        if not result.ok:
            raise ErrNotFound(f"output: no manifest {manifest}")
        if not result.stdout.endswith("\n"):
            raise TransientError(f"output: the manifest {manifest} is being written")
        stdout_files, stderr_files = _parse_manifest(result.stdout)
        files = stdout_files if stream == "stdout" else stderr_files
        directory, prefix = files.locate(posixpath.dirname(manifest))
        offsets: dict[str, int] = {}
        while True:
            ended = True
            if follow:
                try:
                    ended = (await self.inspect(ref)).state is State.ENDED
                except ErrNotFound:
                    ended = True
            more = True
            while more:
                text = output_scripts.read_new_script(directory, prefix, files.suffix,
                                                      offsets)
                read = await self._script(text, f"output of job {ref.id}")
                chunks, more = output_scripts.take_new_bytes(
                    read.stdout, prefix=prefix, suffix=files.suffix, slurm_id=ref.id,
                    offsets=offsets)
                for chunk in chunks:
                    yield chunk
            if ended:
                return
            await self._sleep(self._poll_interval)

