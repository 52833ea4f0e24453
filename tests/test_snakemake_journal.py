"""The Snakemake plugin's journal (``snakemake_executor_plugin_dispatch.journal``): the id
of a job is on disk before its submission, survives a kill (a torn last line too), and
is retired once Snakemake took the job's outcome."""

from __future__ import annotations

from pathlib import Path

from snakemake_executor_plugin_dispatch.journal import Journal


def test_intent_survives_a_restart_and_is_retired_when_finished(tmp_path: Path) -> None:
    path = tmp_path / ".snakemake" / "dispatch" / "journal"
    journal = Journal(path)
    assert journal.open_job("k1") is None
    journal.intend("k1", "A")
    journal.intend("k2", "B")
    journal.finish("k2", "B")
    restarted = Journal(path)  # a new Snakemake on the same directory
    assert (restarted.open_job("k1"), restarted.open_job("k2")) == ("A", None)
    restarted.intend("k1", "C")  # resubmitted (Snakemake's retry): the newest id counts
    restarted.finish("k1", "A")  # an old id's outcome does not retire the new one
    assert Journal(path).open_job("k1") == "C"


def test_torn_line_is_ignored_and_the_file_is_compacted(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = Journal(path)
    for number in range(50):
        journal.intend(f"k{number}", f"ID{number}")
        journal.finish(f"k{number}", f"ID{number}")
    journal.intend("open", "X")
    with path.open("a") as handle:
        handle.write('{"done": false, "id": "Y", "ke')  # killed mid-write
    restarted = Journal(path)
    assert restarted.open_job("open") == "X"
    assert path.read_text().splitlines() == ['{"done": false, "id": "X", "key": "open"}']
