"""The fault suite's one summary table (runs after every ``tests/test_fault_*.py`` module:
pytest collects the files of a directory in name order).

It prints the rows the fault tests recorded in this session (``tests.fault_support``:
kept in memory and in ``$DISPATCH_FAULT_SUMMARY``, default
``/tmp/dispatch-fault-summary.json``), names the faults that did not run (deselected or
skipped), and asserts that no fault lost a job, ran one twice, or wrote to a job that
was not the daemon's own.
"""

from __future__ import annotations

import pytest

from tests.fault_support import SUMMARY_FILE, emit, format_table, session_rows

FAULTS = ("1 ", "2 ", "3 ", "4 ", "5 ", "6 ", "7 ", "8 ")


def test_fault_summary_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = sorted(session_rows(), key=lambda r: r.fault)
    if not rows:
        pytest.skip("no fault test ran in this session")
    missing = [f.strip() for f in FAULTS if not any(r.fault.startswith(f) for r in rows)]
    emit("\n\nFAULT SUITE SUMMARY (lost = duplicates = wrong writes = 0 required)\n"
         + format_table(rows)
         + (f"\n  not run in this session: faults {', '.join(missing)}" if missing else "")
         + f"\n  (rows also in {SUMMARY_FILE})\n", capsys)
    bad = [r.fault for r in rows if (r.lost, r.duplicates, r.wrong_writes) != (0, 0, 0)]
    assert bad == [], f"faults with lost jobs, duplicate executions or wrong writes: {bad}"
