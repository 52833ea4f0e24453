"""What keeps a 100k-job tick's memory down, and that none of it changes an answer:
``classify``'s ``Share`` (one copy of the values observations have in common), and
FindMany's row memory kept by hash, its text split a block at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

import pytest

from controller.model.obs import ObjectObs
from controller.slurm import reads
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.classify import Share, classify
from controller.slurm.record import SlurmJob
from controller.slurm.script import StartSettings
from tests.test_tick_incremental import QueueRunner

T = 1_796_050_000
NOW = T + 4_000
ULIDS = ["01JZ8Q2N5V00000000000000" + f"{i:02d}" for i in range(40)]


def record(i: int, **changes: Any) -> SlurmJob:
    base = SlurmJob(
        job_id=100 + i, name="dj-" + ULIDS[i], user="svc", base_state="RUNNING", flags=(),
        reason="", description="", comment="dispatch:s=1;a=0", submit_time=int(f"{T}"),
        eligible_time=int(f"{T}"), start_time=int(f"{T + 5}"), end_time=int(f"{NOW + 60}"),
        preempt_time=None, restart_count=0, nodes=("".join(["node", "07"]),),
        return_code=None, signal=None, time_limit_s=int("3600"), requeue=False,
        cluster="lab", state_text="RUNNING")
    return dataclasses.replace(base, **changes)


# ---------------------------------------------------------------- Share


@pytest.mark.parametrize("changes", [
    pytest.param({}, id="running"),
    pytest.param({"base_state": "PENDING", "state_text": "PENDING", "reason": "Priority",
                  "start_time": None, "nodes": ()}, id="pending"),
    pytest.param({"base_state": "COMPLETED", "state_text": "COMPLETED", "end_time": T + 60,
                  "nodes": ("node07", "node08")}, id="ended-two-nodes"),
    pytest.param({"base_state": "FAILED", "state_text": "FAILED", "end_time": T + 60,
                  "reason": "NonZeroExitCode", "return_code": 3}, id="failed"),
    pytest.param({"submit_time": None, "eligible_time": None}, id="no-times"),
    pytest.param({"eligible_time": T + 7}, id="eligible-after-submit"),
])
def test_a_shared_observation_equals_the_unshared_one(changes: dict[str, Any]) -> None:
    share = Share()
    for i in range(3):
        job = record(i, **changes)
        assert classify(job, now=NOW, share=share) == classify(job, now=NOW)


def test_observations_of_one_share_hold_one_copy_of_equal_values() -> None:
    share = Share()
    a, b = (classify(record(i), now=NOW, share=share) for i in range(2))
    assert a.submit is b.submit and a.start is b.start and a.eligible is a.submit
    assert a.ref.submit is a.submit and a.time_limit_s is b.time_limit_s
    assert a.nodes is b.nodes and a.nodes[0] is b.nodes[0]
    assert a.ref.uid is not b.ref.uid  # (their own values stay their own)
    # host names are interned: lists of other reads share them too
    other = classify(record(2, nodes=("".join(["node", "07"]), "node08")), now=NOW,
                     share=Share())
    assert other.nodes[0] is a.nodes[0]


def test_a_share_holds_at_most_its_limit() -> None:
    share = Share(limit=2)
    first, second = int("70001"), int("70002")
    assert share(first) is first and share(second) is second
    assert share(int("70001")) is first
    third = int("70003")
    assert share(third) is third and share(int("70003")) is not third  # not kept
    assert share(None) is None and share("") == ""


# ---------------------------------------------------------------- FindMany's row memory


@pytest.mark.parametrize("text", [
    pytest.param("", id="empty"),
    pytest.param("100|a\n101|b\n200|c\n", id="plain"),
    pytest.param("100|a\r\n300|b\r\n\r\n400|c", id="crlf-blank-and-unterminated"),
    pytest.param("1|ab\rcd\x1cef\u2028gh\n500|\n\n600|ij\x85k\n", id="other-line-breaks"),
    pytest.param("\n\n\n", id="only-newlines"),
    pytest.param("x" * 10 + "\n" + "y" * 3 + "\r\n" + "z\n", id="long-lines"),
    pytest.param("".join(f"{i}|x\n" for i in range(90, 420)), id="many-cuts"),
    pytest.param("".join(f"{i}1|x\n" for i in range(300)), id="no-cut"),
])
@pytest.mark.parametrize("least", [1, 2, 7, 64, 1 << 20])
def test_runs_split_as_splitlines_and_end_before_a_cut(text: str, least: int) -> None:
    pieces = list(reads._runs(text, least))
    assert "".join(pieces) == text
    assert [line for piece in pieces for line in piece.splitlines()] == text.splitlines()
    assert all(piece.endswith("\n") for piece in pieces[:-1])
    # (shorter than a block: every run but the first starts with a job id ending in "00")
    assert all(re.match(r"[0-9]*00\|", piece) for piece in pieces[1:])
    cuts = [m.start() for m in re.finditer(r"(?<=\n)[0-9]*00\|", text)]
    if least == 1 and text:  # then a run ends before each of them
        assert len(pieces) == 1 + len(cuts)


def row(slurm_id: int, job_id: str, *, node: str = "node1") -> str:
    return (f"{slurm_id}|dj-{job_id}|dispatch|R|RUNNING|None|2027-01-15T08:00:00|"
            f"2027-01-15T08:00:00|2027-01-15T08:00:10|N/A|N/A|1:00:00|0|0|0|{node}|lab|"
            "dispatch:s=1;a=0|")


def adapter_for(runner: QueueRunner) -> SlurmAdapter:
    return SlurmAdapter(runner, cluster="lab", user="dispatch",  # type: ignore[arg-type]
                        settings=StartSettings(output_dir="/tmp/out"),
                        clock=lambda: 1_800_000_000)


def test_rows_are_remembered_by_hash_not_by_text() -> None:
    runner = QueueRunner()
    adapter = adapter_for(runner)
    a, b = ULIDS[:2]
    runner.text = row(11, a) + "\n" + row(12, b) + "\n"
    first = asyncio.run(adapter.find_many([a, b]))
    assert set(adapter._live_rows) == {hash(row(11, a)), hash(row(12, b))}
    again = asyncio.run(adapter.find_many([a, b]))
    assert again[a][0] is first[a][0] and again[b][0] is first[b][0]
    # one read's observations share what they have in common
    assert first[a][0].nodes is first[b][0].nodes and first[a][0].submit is first[b][0].submit


def test_a_steady_read_builds_no_container_per_job() -> None:
    """An unchanged row gives back the very same one-element tuple, and a job with no
    object the one shared empty tuple: a steady 100k-job read allocates nothing per job
    that the cyclic collector would promote to its oldest generation (bench/tick: two
    full collections in three steady ticks at 100k without it, 0.18 s each)."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    a, b, c = ULIDS[:3]
    runner.text = row(11, a) + "\n" + row(12, b) + "\n"
    first = asyncio.run(adapter.find_many([a, b, c]))
    again = asyncio.run(adapter.find_many([a, b, c]))
    assert again[a] is first[a] and again[b] is first[b]
    assert again[c] is first[c] == ()


def test_a_remembered_row_of_another_job_is_never_reused() -> None:
    """Two jobs' rows with equal hashes (forced here) never mix up their observations."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    a, b = ULIDS[:2]
    runner.text = row(11, a) + "\n"
    (obs_a,) = asyncio.run(adapter.find_many([a, b]))[a]
    memo = adapter._live_rows[hash(row(11, a))]
    runner.text = row(12, b) + "\n"
    adapter._live_rows = {hash(row(12, b)): memo}  # b's row "collides" with a's memo
    got = asyncio.run(adapter.find_many([a, b]))
    assert not got[a] and len(got[b]) == 1
    obs_b: ObjectObs = got[b][0]
    assert obs_b is not obs_a and obs_b.ref.uid == "dj-" + b and obs_b.ref.id == 12


def test_a_queue_longer_than_a_run_is_read_whole() -> None:
    runner = QueueRunner()
    adapter = adapter_for(runner)
    jobs = ["01JZ8Q2N5V" + f"{i:016d}" for i in range(7000)]
    runner.text = "".join(row(100 + i, job_id, node=f"node{i % 3}") + "\n"
                          for i, job_id in enumerate(jobs))
    assert len(runner.text) > 1 << 20 and len(list(reads._runs(runner.text))) > 1
    found = asyncio.run(adapter.find_many(jobs))
    assert [obs.ref.id for job_id in jobs for obs in found[job_id]] == [
        100 + i for i in range(len(jobs))]
    assert len(adapter._live_rows) == len(jobs)


def test_rows_that_left_the_queue_are_forgotten_the_others_kept_in_place() -> None:
    """The row memory is updated in place (no new 100k-entry dict per read): a read
    that lost a few rows drops just those and keeps the same dict and observations; one
    that lost most of them gets a smaller dict; a row seen again after it left is
    classified afresh. No job id string is kept per row."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    jobs = ULIDS[:8]
    runner.text = "".join(row(11 + i, job_id) + "\n" for i, job_id in enumerate(jobs))
    first = asyncio.run(adapter.find_many(jobs))
    rows = adapter._live_rows
    assert len(rows) == 8 and not any(isinstance(r.named, str) for r in rows.values())
    runner.text = "".join(row(11 + i, job_id) + "\n" for i, job_id in enumerate(jobs)
                          if i != 3)  # one left
    again = asyncio.run(adapter.find_many(jobs))
    assert adapter._live_rows is rows and hash(row(14, jobs[3])) not in rows
    assert len(rows) == 7 and again[jobs[3]] == ()
    assert all(again[j] is first[j] for j in jobs if j != jobs[3])
    runner.text = row(11, jobs[0]) + "\n" + row(14, jobs[3]) + "\n"  # most left; one back
    last = asyncio.run(adapter.find_many(jobs))
    assert adapter._live_rows is not rows
    assert set(adapter._live_rows) == {hash(row(11, jobs[0])), hash(row(14, jobs[3]))}
    assert last[jobs[0]] is first[jobs[0]] and last[jobs[3]] is not first[jobs[3]]
    assert last[jobs[3]][0] == first[jobs[3]][0]  # (classified again: the same answer)
    assert [j for j in jobs if last[j]] == [jobs[0], jobs[3]]


def test_another_users_row_named_like_ours_is_remembered_by_its_name() -> None:
    runner = QueueRunner()
    adapter = adapter_for(runner)
    a, b = ULIDS[:2]
    other = row(12, b).replace("|dispatch|", "|mallory|", 1)
    runner.text = row(11, a) + "\n" + other + "\n"
    for _ in range(2):
        got = asyncio.run(adapter.find_many([a, b]))
        assert len(got[a]) == 1 and got[b] == ()
        assert adapter._live_rows[hash(other)].named == "dj-" + b


# ---------------------------------------------------------------- runs of lines


def queue(jobs: list[str], *, first: int = 100, node: str = "node1") -> str:
    """One row per job, ids from ``first`` (every hundredth ends in "00": a run cut)."""
    return "".join(row(first + i, job_id, node=node) + "\n" for i, job_id in enumerate(jobs))


def lines_read(adapter: SlurmAdapter, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lines each read went through one by one (``_classified_run``'s runs), by read."""
    counts: list[int] = []
    looked = adapter._classified_run

    def counting(text: str, now: int, **kwargs: Any) -> Any:
        counts[-1] += len(text.splitlines())
        return looked(text, now, **kwargs)

    monkeypatch.setattr(adapter, "_classified_run", counting)
    before = adapter._classified_rows

    async def each_read(*args: Any, **kwargs: Any) -> None:
        counts.append(0)
        await before(*args, **kwargs)

    monkeypatch.setattr(adapter, "_classified_rows", each_read)
    return counts


JOBS = ["01JZ8Q2N5V" + f"{i:016d}" for i in range(3000)]


def test_a_steady_read_goes_through_no_line_of_an_unchanged_queue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: the live read's cost is squeue's own text plus a cheap check -- an
    unchanged queue of 3,000 rows is cut into runs and each run found by its hash; no
    line is split out, hashed or looked up again, and every job gets its very same
    observation."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    counts = lines_read(adapter, monkeypatch)
    runner.text = queue(JOBS)
    first = asyncio.run(adapter.find_many(JOBS))
    again = asyncio.run(adapter.find_many(JOBS))
    assert counts == [3000, 0]
    assert all(again[j] is first[j] for j in JOBS)
    assert 8 <= len(adapter._live_runs) <= 40  # (runs of ~360 rows: at least 64 kB each)


def test_a_changed_row_reads_its_own_run_again_and_no_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One row changed, one left, one came: only the runs around them are read line by
    line (where a run ends depends on the lines, not on offsets); the other jobs keep
    their observations, the changed ones are read afresh."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    counts = lines_read(adapter, monkeypatch)
    runner.text = queue(JOBS)
    first = asyncio.run(adapter.find_many(JOBS))
    rows = runner.text.splitlines(keepends=True)
    moved = rows[1500].replace("|node1|", "|node9|")
    runner.text = "".join([*rows[:10], *rows[11:1500], moved, *rows[1501:]])  # 10 left
    runner.text += row(9999, JOBS[10]) + "\n"  # ... and is back with a new id at the end
    again = asyncio.run(adapter.find_many(JOBS))
    longest = max(len(run.rows) for run in adapter._live_runs.values())
    assert 0 < counts[1] <= 3 * 2 * longest
    assert again[JOBS[1500]][0].nodes == ("node9",)
    assert again[JOBS[10]][0].ref.id == 9999
    same = [j for j in JOBS if again[j] is first[j]]
    assert len(same) == 2998


def test_a_run_whose_row_expires_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run holds until the first of its rows may no longer hold (a start or end time
    then ahead): after it, the run is read line by line again."""
    now = [1_800_000_100]  # (every row's start time, 1_800_000_010, is past)
    runner = QueueRunner()
    adapter = SlurmAdapter(runner, cluster="lab", user="dispatch",
                           settings=StartSettings(output_dir="/tmp/out"), clock=lambda: now[0])
    counts = lines_read(adapter, monkeypatch)
    rows = queue(JOBS[:1000]).splitlines(keepends=True)
    ahead = "2027-01-15T09:00:00"  # 1_800_003_600: an end time 3,500 s ahead
    rows[7] = rows[7].replace("|N/A|N/A|1:00:00|", f"|{ahead}|N/A|1:00:00|")
    runner.text = "".join(rows)
    asyncio.run(adapter.find_many(JOBS[:1000]))
    asyncio.run(adapter.find_many(JOBS[:1000]))
    now[0] = 1_800_003_600
    asyncio.run(adapter.find_many(JOBS[:1000]))
    assert counts[1] == 0 and 7 < counts[2] < 1000


def test_a_read_of_a_few_jobs_keeps_the_memory_of_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Find of one job (``find_many([id])``) on the same queue keeps every other row's
    observation and every run: the next read of all of them goes through no line."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    counts = lines_read(adapter, monkeypatch)
    runner.text = queue(JOBS)
    first = asyncio.run(adapter.find_many(JOBS))
    one = asyncio.run(adapter.find(JOBS[5]))
    again = asyncio.run(adapter.find_many(JOBS))
    assert one == [first[JOBS[5]][0]]
    assert counts == [3000, 0, 0]
    assert all(again[j] is first[j] for j in JOBS)


def test_a_run_with_rows_not_asked_for_is_not_remembered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that skipped rows of ours it was not asked for (no strays wanted) leaves
    no memory of their runs: a later read asking for them reads them."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    counts = lines_read(adapter, monkeypatch)
    runner.text = queue(JOBS)
    some = asyncio.run(adapter.find_many(JOBS[:100]))
    assert not adapter._live_runs and len(adapter._live_rows) == 100
    every = asyncio.run(adapter.find_many(JOBS))
    assert counts == [3000, 3000] and all(every[j] for j in JOBS)
    assert all(every[j] is some[j] for j in JOBS[:100])


def test_a_remembered_run_of_other_text_is_never_reused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's memory found by a hash of other text (forced here) is not used: its
    length and ends are checked."""
    runner = QueueRunner()
    adapter = adapter_for(runner)
    counts = lines_read(adapter, monkeypatch)
    runner.text = queue(JOBS[:300])
    asyncio.run(adapter.find_many(JOBS[:300]))
    (memo,) = adapter._live_runs.values()
    runner.text = queue(JOBS[:300], node="node2")
    adapter._live_runs = {hash(runner.text): memo}
    got = asyncio.run(adapter.find_many(JOBS[:300]))
    assert counts[1] == 300 and all(got[j][0].nodes == ("node2",) for j in JOBS[:300])
