"""Metrics: a golden exposition of a fixed state from an isolated registry, the gauges the
tick derives from the controller's own state, and the per-cluster views of one registry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controller.metrics import OBJECT_STATES, PHASES, Families, Metrics

GOLDEN = Path(__file__).resolve().parent.parent / "testdata/golden/metrics/fixed-state.prom"


def fixed_state() -> Metrics:
    m = Metrics(CollectorRegistry())
    m.set_phase_counts({"pending": 3, "running": 2, "succeeded": 40, "failed": 5})
    m.set_object_counts({"pending": 2, "gated": 1, "held": 1, "running": 2})
    m.submissions.inc(52)
    m.resubmissions.labels(cause="node-lost").inc(2)
    m.endings.labels(phase="succeeded", cause="completed").inc(40)
    m.endings.labels(phase="failed", cause="non-zero-exit").inc(5)
    m.duplicates.inc()
    m.tick_duration.observe(0.2)
    m.tick_duration.observe(1.7)
    m.last_tick.set(1_800_000_000)
    m.ticks.labels(result="ok").inc(10)
    m.observe_command("squeue", 0.03, True)
    m.observe_command("sbatch", 0.2, False)
    m.slurm_up.set(1)
    m.accounting_up.set(1)
    m.set_leader(held=True, epoch=4, holder="replica-a", seen_epoch=4)
    m.cluster_running.set(7)
    m.cluster_pending.set(11)
    m.queue_wait.labels(method="estimate").set(120)
    m.tracked.set(5)
    gpu = m.for_cluster("gpu")  # a second shard, led by another replica
    gpu.set_phase_counts({"running": 1})
    gpu.set_object_counts({"running": 1})
    gpu.submissions.inc()
    gpu.set_leader(held=False, epoch=None, holder="replica-b", seen_epoch=2)
    m.set_shards_held(1)
    m.set_replicas_live(2)
    return m


def test_golden_exposition() -> None:
    text = generate_latest(fixed_state().registry).decode()
    text = "\n".join(line for line in text.splitlines() if "_created" not in line) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_queued_and_running_derive_from_object_states() -> None:
    reg = fixed_state().registry
    assert reg.get_sample_value("dispatch_jobs_queued", {"cluster": "lab"}) == 4
    assert reg.get_sample_value("dispatch_jobs_running", {"cluster": "lab"}) == 2
    assert reg.get_sample_value("dispatch_jobs", {"cluster": "lab", "phase": "cancelled"}) == 0
    assert reg.get_sample_value("dispatch_jobs_running", {"cluster": "gpu"}) == 1


def test_registries_are_isolated() -> None:
    a, b = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    a.submissions.inc()
    assert b.registry.get_sample_value("dispatch_submissions_total", {"cluster": "lab"}) == 0


def test_two_views_on_one_registry_keep_separate_series() -> None:
    lab = Metrics(CollectorRegistry())
    gpu = lab.for_cluster("gpu")
    assert (gpu.registry, gpu.families, gpu.cluster) == (lab.registry, lab.families, "gpu")
    lab.submissions.inc(3)
    gpu.submissions.inc()
    lab.ticks.labels(result="ok").inc()
    gpu.endings.labels(phase="failed", cause="non-zero-exit").inc(2)
    gpu.set_phase_counts({"running": 6})
    reg = lab.registry

    def value(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    assert value("dispatch_submissions_total", cluster="lab") == 3
    assert value("dispatch_submissions_total", cluster="gpu") == 1
    assert value("dispatch_ticks_total", cluster="lab", result="ok") == 1
    assert value("dispatch_ticks_total", cluster="gpu", result="ok") == 0
    assert value("dispatch_job_endings_total", cluster="gpu", phase="failed",
                 cause="non-zero-exit") == 2
    assert value("dispatch_job_endings_total", cluster="lab", phase="failed",
                 cause="non-zero-exit") is None
    assert value("dispatch_jobs", cluster="gpu", phase="running") == 6
    assert value("dispatch_jobs", cluster="lab", phase="running") == 0


@pytest.mark.parametrize(("name", "labels"), [
    *[pytest.param("dispatch_jobs", {"phase": p}, id=f"jobs-{p}") for p in PHASES],
    *[pytest.param("dispatch_job_objects", {"state": s}, id=f"objects-{s}")
      for s in OBJECT_STATES],
    *[pytest.param("dispatch_queue_estimated_wait_seconds", {"method": m}, id=f"wait-{m}")
      for m in ("estimate", "observed")],
    *[pytest.param("dispatch_ticks_total", {"result": r}, id=f"ticks-{r}")
      for r in ("ok", "slurm-unreachable", "error")],
    pytest.param("dispatch_tick_duration_seconds_count", {}, id="tick-duration"),
    pytest.param("dispatch_leader", {}, id="leader"),
    pytest.param("dispatch_slurm_up", {}, id="slurm-up"),
    pytest.param("dispatch_submissions_total", {}, id="submissions"),
    pytest.param("dispatch_tracked_jobs", {}, id="tracked"),
])
def test_each_view_precreates_its_zeros(name: str, labels: dict[str, str]) -> None:
    lab = Metrics(CollectorRegistry())
    lab.for_cluster("gpu")
    for cluster in ("lab", "gpu"):
        assert lab.registry.get_sample_value(name, {"cluster": cluster, **labels}) == 0


def test_a_cluster_has_no_series_before_its_view() -> None:
    lab = Metrics(CollectorRegistry())
    assert lab.registry.get_sample_value("dispatch_leader", {"cluster": "gpu"}) is None
    lab.for_cluster("gpu")
    assert lab.registry.get_sample_value("dispatch_leader", {"cluster": "gpu"}) == 0


def leader_info(m: Metrics) -> set[tuple[str, str, str]]:
    return {(s.labels["cluster"], s.labels["holder"], s.labels["epoch"])
            for family in m.registry.collect() if family.name == "dispatch_leader_info"
            for s in family.samples}


def test_leader_info_is_per_cluster() -> None:
    lab = Metrics(CollectorRegistry())
    gpu = lab.for_cluster("gpu")
    lab.set_leader(held=True, epoch=3, holder="a", seen_epoch=3)
    gpu.set_leader(held=False, epoch=None, holder="b", seen_epoch=7)
    assert leader_info(lab) == {("lab", "a", "3"), ("gpu", "b", "7")}
    lab.set_leader(held=False, epoch=3, holder="c", seen_epoch=4)  # c took lab over
    assert leader_info(lab) == {("lab", "c", "4"), ("gpu", "b", "7")}
    lab.for_cluster("lab").set_leader(held=False, epoch=None, holder=None, seen_epoch=None)
    assert leader_info(lab) == {("gpu", "b", "7")}
    reg = lab.registry
    assert reg.get_sample_value("dispatch_leader", {"cluster": "lab"}) == 0
    assert reg.get_sample_value("dispatch_leader_epoch", {"cluster": "lab"}) == 0


def test_leader_and_epoch_per_cluster() -> None:
    lab = Metrics(CollectorRegistry())
    gpu = lab.for_cluster("gpu")
    lab.set_leader(held=True, epoch=5, holder="me", seen_epoch=5)
    gpu.set_leader(held=False, epoch=None, holder="other", seen_epoch=9)
    reg = lab.registry
    assert reg.get_sample_value("dispatch_leader", {"cluster": "lab"}) == 1
    assert reg.get_sample_value("dispatch_leader_epoch", {"cluster": "lab"}) == 5
    assert reg.get_sample_value("dispatch_leader", {"cluster": "gpu"}) == 0
    assert reg.get_sample_value("dispatch_leader_epoch", {"cluster": "gpu"}) == 0


def test_process_gauges_have_no_cluster_label() -> None:
    lab = Metrics(CollectorRegistry())
    assert lab.registry.get_sample_value("dispatch_shards_held") == 0
    lab.for_cluster("gpu").set_shards_held(2)
    lab.set_replicas_live(3)
    assert lab.registry.get_sample_value("dispatch_shards_held") == 2
    assert lab.registry.get_sample_value("dispatch_replicas_live") == 3


def test_a_view_rejects_a_foreign_registry_and_an_empty_cluster() -> None:
    families = Families(CollectorRegistry())
    assert Metrics(families.registry, families=families).registry is families.registry
    with pytest.raises(ValueError, match="differ"):
        Metrics(CollectorRegistry(), families=families)
    with pytest.raises(ValueError, match="non-empty"):
        Metrics(cluster="", families=families)


def test_no_per_job_labels() -> None:
    for family in fixed_state().registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= {"cluster", "phase", "state", "cause", "command",
                                          "result", "method", "le", "action", "holder",
                                          "epoch"}, sample
            if family.name not in ("dispatch_shards_held", "dispatch_replicas_live",
                                   "dispatch_jobs_unconfigured_cluster"):
                assert "cluster" in sample.labels, sample
