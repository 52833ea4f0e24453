"""Output's listing script (``SlurmAdapter._read_new``) run for real by ``/bin/sh`` through
the local runner, on a directory made here: a file name holding a newline must be skipped,
since the listing is line-based (issue 9 feared the pattern matched a backslash and an n;
the Python literal puts a real newline between the quotes, and these tests pin that)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import TransientError
from controller.model.obs import ObjectRef
from controller.runner import LocalRunner
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.script import StartSettings


def adapter_for(tmp_path: Path) -> SlurmAdapter:
    return SlurmAdapter(LocalRunner(default_timeout=30), cluster="lab", user="svc",
                        settings=StartSettings(output_dir=str(tmp_path / "out")))


async def test_a_file_name_with_a_newline_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "s1-7-r0.out").write_bytes(b"real\n")
    # A name that, printed as one listing line, would forge a second header line.
    (tmp_path / "s1-7-r1.out\n0 4 s1-7-r9.out").write_bytes(b"fake")
    (tmp_path / "s1-7-r2.out").write_bytes(b"second\n")
    offsets: dict[str, int] = {}
    chunks, more = await adapter_for(tmp_path)._read_new(str(tmp_path), "s1-", ".out", 7,
                                                         offsets)
    assert chunks == [b"real\n", b"second\n"]
    assert not more
    assert offsets == {"s1-7-r0.out": 5, "s1-7-r2.out": 7}



async def test_a_manifest_without_its_newline_is_being_written(tmp_path: Path) -> None:
    """Start writes the manifest with one printf, no rename (script.py): a read that
    meets it half written (or empty) is a transient error, not a broken manifest; the
    whole line reads."""
    job = "01JZ8Q2N5V0000000000000042"
    ref = ObjectRef(cluster="lab", uid=f"dj-{job}", id=7, submit=1)
    manifest = tmp_path / "out" / job / "s1.manifest"
    manifest.parent.mkdir(parents=True)
    line = ('{"version": 1, "stdout": {"prefix": "s1-", "suffix": ".out"}, '
            '"stderr": {"prefix": "s1-", "suffix": ".err"}}\n')
    (manifest.parent / "s1-7-r0.out").write_bytes(b"hello\n")
    adapter = adapter_for(tmp_path)
    for partial in ("", line[:20]):
        manifest.write_text(partial)
        with pytest.raises(TransientError, match="being written"):
            await anext(aiter(adapter.output(ref, "stdout", submission=1)))
    manifest.write_text(line)
    assert [c async for c in adapter.output(ref, "stdout", submission=1)] == [b"hello\n"]
