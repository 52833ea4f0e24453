"""Metrics: a golden exposition of a fixed state from an isolated registry, and the
gauges the tick derives from the controller's own state."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from controller.metrics import Metrics

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
    m.leader.set(1)
    m.cluster_running.set(7)
    m.cluster_pending.set(11)
    m.queue_wait.labels(method="estimate").set(120)
    m.tracked.set(5)
    return m


def test_golden_exposition() -> None:
    text = generate_latest(fixed_state().registry).decode()
    text = "\n".join(line for line in text.splitlines() if "_created" not in line) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_queued_and_running_derive_from_object_states() -> None:
    m = fixed_state()
    reg = m.registry
    assert reg.get_sample_value("dispatch_jobs_queued") == 4
    assert reg.get_sample_value("dispatch_jobs_running") == 2
    assert reg.get_sample_value("dispatch_jobs", {"phase": "cancelled"}) == 0


def test_registries_are_isolated() -> None:
    a, b = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    a.submissions.inc()
    assert b.registry.get_sample_value("dispatch_submissions_total") == 0


def test_no_per_job_labels() -> None:
    for family in fixed_state().registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= {"phase", "state", "cause", "command", "result",
                                          "method", "le", "action"}, sample
