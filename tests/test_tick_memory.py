"""What keeps a 100k-job tick's memory down, and that none of it changes an answer:
``classify``'s ``Share`` (one copy of the values observations have in common), and
FindMany's row memory kept by hash, its text split a block at a time."""

from __future__ import annotations

import asyncio
import dataclasses
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
    pytest.param("a\nb\n", id="plain"),
    pytest.param("a\r\nb\r\n\r\nc", id="crlf-blank-and-unterminated"),
    pytest.param("ab\rcd\x1cef\u2028gh\n\nij\x85k\n", id="other-line-breaks"),
    pytest.param("\n\n\n", id="only-newlines"),
    pytest.param("x" * 10 + "\n" + "y" * 3 + "\r\n" + "z\n", id="long-lines"),
])
@pytest.mark.parametrize("block", [1, 2, 3, 5, 1 << 20])
def test_blocks_split_as_splitlines(text: str, block: int) -> None:
    pieces = list(reads._blocks(text, block))
    assert "".join(pieces) == text
    assert [line for piece in pieces for line in piece.splitlines()] == text.splitlines()
    assert all(piece.endswith("\n") for piece in pieces[:-1])


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


def test_a_queue_longer_than_a_block_is_read_whole() -> None:
    runner = QueueRunner()
    adapter = adapter_for(runner)
    jobs = ["01JZ8Q2N5V" + f"{i:016d}" for i in range(7000)]
    runner.text = "".join(row(100 + i, job_id, node=f"node{i % 3}") + "\n"
                          for i, job_id in enumerate(jobs))
    assert len(runner.text) > 1 << 20 and len(list(reads._blocks(runner.text))) > 1
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
