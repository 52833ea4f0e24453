"""Output's listing script (``SlurmAdapter._read_new``) run for real by ``/bin/sh`` through
the local runner, on a directory made here: a file name holding a newline must be skipped,
since the listing is line-based (issue 9 feared the pattern matched a backslash and an n;
the Python literal puts a real newline between the quotes, and these tests pin that)."""

from __future__ import annotations

from pathlib import Path

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

