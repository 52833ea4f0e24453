"""The Snakemake plugin's pure mapping (``snakemake_executor_plugin_dispatch.mapping``):
resources to the job document (unknown ones refused, naming the rule and the key),
labels, the policy that leaves application failures to Snakemake's --retries, and a
job's view read back as Snakemake's outcome. Every document is also checked by the
controller's own parser, so what the plugin writes is what the daemon accepts."""

from __future__ import annotations

from typing import Any

import pytest

from controller.model.obs import CauseKind
from controller.model.policy import Recovery, parse_policy
from controller.model.spec import parse_job_document
from snakemake_executor_plugin_dispatch.mapping import (
    APPLICATION_CAUSES,
    INFRASTRUCTURE_CAUSES,
    Ending,
    JobFacts,
    MappingError,
    Submit,
    job_document,
    job_policy,
    journal_key,
    label_value,
    log_files,
    outcome,
    parse_labels,
    run_identity,
)

SUBMIT = Submit(run_id="0123456789abcdef", workdir="/data/wf", labels={"team": "x"})


def facts(resources: dict[str, Any] | None = None, **kw: Any) -> JobFacts:
    base: dict[str, Any] = {
        "name": "align", "rules": ("align",), "jobid": "7", "attempt": 1, "threads": 2,
        "resources": {"_cores": 2, "_nodes": 1, "tmpdir": "<TBD>", **(resources or {})},
        "wildcards": {"sample": "A/1"}, "outputs": ("out/A/1.bam",)}
    base.update(kw)
    return JobFacts(**base)


def document(resources: dict[str, Any] | None = None, *, ignore: frozenset[str] = frozenset(),
             **kw: Any) -> dict[str, Any]:
    submit = Submit(run_id=SUBMIT.run_id, workdir=SUBMIT.workdir, labels=SUBMIT.labels,
                    cluster=kw.pop("cluster", None), ignore=ignore)
    doc = job_document(facts(resources, **kw), command="python -m snakemake --target-jobs x",
                       log_base="/data/wf/.snakemake/dispatch/log/align/L", submit=submit)
    parse_job_document(doc)  # the daemon's own validation accepts it
    return doc


@pytest.mark.parametrize(("resources", "expected_resources", "slurm"), [
    pytest.param({}, {"cpus_per_task": 2}, None, id="threads"),
    pytest.param({"cpus_per_task": 4}, {"cpus_per_task": 4}, None, id="cpus_per_task-wins"),
    pytest.param({"mem_mb": 1000, "mem_mib": 954, "mem": "1000MB"},
                 {"cpus_per_task": 2, "memory_mb": 954}, None, id="mem_mib"),
    pytest.param({"mem_mb": 1000}, {"cpus_per_task": 2, "memory_mb": 954}, None,
                 id="mem_mb-as-mib"),
    pytest.param({"runtime": 90}, {"cpus_per_task": 2, "time_limit_s": 5400}, None,
                 id="runtime-minutes"),
    pytest.param({"nodes": 2, "tasks": 8}, {"cpus_per_task": 2, "nodes": 2, "tasks_per_node": 4},
                 None, id="nodes-tasks"),
    pytest.param({"gpu": 1}, {"cpus_per_task": 2, "gpus_per_node": 1}, None, id="gpu"),
    pytest.param({"gpu": 2, "gpu_model": "a100"}, {"cpus_per_task": 2},
                 {"Resources": {"gres": "gpu:a100:2"}}, id="gpu-model"),
    pytest.param({"slurm_partition": "debug", "slurm_account": "lab", "qos": "high",
                  "constraint": "avx2", "gres": "tmp:10G"}, {"cpus_per_task": 2},
                 {"Placement": {"partition": "debug", "account": "lab", "qos": "high",
                                "constraint": "avx2"}, "Resources": {"gres": "tmp:10G"}},
                 id="slurm-placement"),
    pytest.param({"mem_mb": 1000, "mem_mb_per_cpu": 500}, {"cpus_per_task": 2},
                 {"Resources": {"mem_per_cpu_mb": 500}}, id="mem-per-cpu-drops-mem"),
    pytest.param({"disk_mb": 1000, "disk_mib": 954, "gpu_manufacturer": "nvidia"},
                 {"cpus_per_task": 2}, None, id="unused-standard"),
])
def test_resources(resources: dict[str, Any], expected_resources: dict[str, int],
                   slurm: dict[str, Any] | None) -> None:
    doc = document(resources)
    assert doc["resources"] == expected_resources
    assert doc["extensions"].get("slurm") == slurm


def test_document_shape() -> None:
    doc = document(cluster="gpu")
    assert doc["command"] == ["/bin/sh", "-c", "python -m snakemake --target-jobs x"]
    assert doc["workdir"] == "/data/wf" and doc["cluster"] == "gpu"
    assert doc["name"] == "align sample=A/1"
    assert doc["labels"] == {"team": "x", "snakemake/run": "0123456789abcdef",
                             "snakemake/rule": "align", "snakemake/jobid": "7",
                             "snakemake/attempt": "1",
                             "snakemake/wildcards": label_value("sample=A/1")}
    assert doc["extensions"]["dispatch"] == {"Output": {
        "stdout": "/data/wf/.snakemake/dispatch/log/align/L.out",
        "stderr": "/data/wf/.snakemake/dispatch/log/align/L.err"}}


@pytest.mark.parametrize(("resources", "message"), [
    pytest.param({"slurm_extra": "--exclusive"}, "rule align: resource 'slurm_extra' is not "
                 "supported", id="unknown-key"),
    pytest.param({"mem_mb": "lots"}, "rule align: resource mem_mb='lots' must be a positive",
                 id="not-a-number"),
    pytest.param({"runtime": 0}, "rule align: resource runtime=0", id="zero"),
    pytest.param({"nodes": 2, "tasks": 3}, "tasks=3 is not a multiple of nodes=2",
                 id="tasks-nodes"),
    pytest.param({"gpu_model": "a100"}, "gpu_model needs gpu", id="model-without-count"),
])
def test_refused(resources: dict[str, Any], message: str) -> None:
    with pytest.raises(MappingError, match=message.replace("(", r"\(")):
        document(resources)


def test_unknown_resource_of_a_group_names_the_group_and_is_let_through_when_ignored() -> None:
    with pytest.raises(MappingError, match="group foo: resource 'scratch'"):
        document({"scratch": 1}, name="foo", is_group=True, wildcards={})
    assert document({"scratch": 1}, ignore=frozenset({"scratch"}))["resources"] == {
        "cpus_per_task": 2}


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("align", "align", id="plain"),
    pytest.param("a" * 63, "a" * 63, id="longest"),
    pytest.param("_private", "private-" + "", id="leading-underscore"),
    pytest.param("sample=A/1", "sample-A-1-", id="slash"),
])
def test_label_value(text: str, expected: str) -> None:
    value = label_value(text)
    parse_job_document({"command": ["true"], "workdir": "/", "labels": {"k": value}})
    assert value.startswith(expected) and len(value) <= 63
    assert label_value("x" * 100) != label_value("x" * 101)


def test_parse_labels() -> None:
    assert parse_labels("team=x, env=prod") == {"team": "x", "env": "prod"}
    assert parse_labels(None) == {}
    for bad in ("team", "snakemake/run=x", "k=a b", "=x"):
        with pytest.raises(MappingError):
            parse_labels(bad)


def test_identities() -> None:
    assert run_identity("/a", "/a/Snakefile") == run_identity("/a", "/a/Snakefile")
    assert run_identity("/a", "/a/Snakefile") != run_identity("/b", "/a/Snakefile")
    one = facts()
    assert journal_key(one) == journal_key(facts(jobid="99", attempt=3))
    assert journal_key(one) != journal_key(facts(outputs=("out/B.bam",)))


def test_policy_leaves_application_failures_to_snakemake() -> None:
    policy = parse_policy(job_policy({"causes": {"node-lost": {"budget": 1,
                                                               "exclude_node": False}}}))
    for name in APPLICATION_CAUSES:
        assert policy.rule(CauseKind(name)).recovery is Recovery.FAIL, name
    assert policy.retry_exit_codes == frozenset()
    for name in INFRASTRUCTURE_CAUSES:
        assert policy.rule(CauseKind(name)).recovery is Recovery.RESUBMIT, name
    assert policy.rule(CauseKind.NODE_LOST).budget == 1
    assert parse_policy(job_policy(None)).rule(CauseKind.PREEMPTED).budget == 5


@pytest.mark.parametrize("user", [
    pytest.param({"causes": {"non-zero-exit": {"action": "resubmit"}}}, id="action"),
    pytest.param({"causes": {"timeout": {"budget": 2}}}, id="budget"),
    pytest.param({"retry_exit_codes": [3]}, id="exit-codes"),
])
def test_policy_that_resubmits_application_failures_is_refused(user: dict[str, Any]) -> None:
    with pytest.raises(MappingError, match="--retries"):
        job_policy(user)


VIEW = {"phase": "failed", "cause": "non-zero-exit", "cause_detail": "", "exit_code": 1,
        "slurm_job_id": 42, "nodes": "vm", "attempt": 0, "warning": False, "reason": ""}


@pytest.mark.parametrize(("view", "ending", "message"), [
    pytest.param({**VIEW, "phase": "pending"}, Ending.ACTIVE, "", id="pending"),
    pytest.param({**VIEW, "phase": "held"}, Ending.ACTIVE, "", id="held"),
    pytest.param({**VIEW, "phase": "running"}, Ending.ACTIVE, "", id="running"),
    pytest.param({**VIEW, "phase": "succeeded"}, Ending.SUCCESS, "", id="succeeded"),
    pytest.param(VIEW, Ending.FAILURE,
                 "dispatch job J failed: cause non-zero-exit; exit code 1; Slurm job 42 on vm. ",
                 id="failed"),
    pytest.param({**VIEW, "cause": "node-lost", "exit_code": None, "attempt": 3,
                  "cause_detail": "NODE_FAIL"}, Ending.FAILURE,
                 "dispatch job J failed: cause node-lost (NODE_FAIL); Slurm job 42 on vm; "
                 "after 3 resubmission(s) by the daemon. ", id="budget-spent"),
    pytest.param({**VIEW, "warning": True}, Ending.FAILURE, "failed with a warning",
                 id="warning"),
    pytest.param({**VIEW, "phase": "cancelled", "cause": "cancelled", "exit_code": None,
                  "slurm_job_id": None}, Ending.FAILURE,
                 "dispatch job J cancelled: cause cancelled. ", id="cancelled"),
    pytest.param({**VIEW, "phase": "rejected", "cause": None, "exit_code": None,
                  "slurm_job_id": None, "reason": "sbatch: invalid partition"},
                 Ending.FAILURE, "reason: sbatch: invalid partition", id="rejected"),
    pytest.param(None, Ending.FAILURE, "not in the database", id="missing"),
])
def test_outcome(view: dict[str, Any] | None, ending: Ending, message: str) -> None:
    result = outcome("J", view)
    assert result.ending is ending
    assert message in result.message


def test_log_files() -> None:
    names = ["J.out.s1-42-r0", "J.err.s1-42-r0", "K.out.s1-43-r0", "J.out", "J.err.s2-44-r0"]
    assert log_files("/w/log/J", names) == [
        "/w/log/J.err.s1-42-r0", "/w/log/J.err.s2-44-r0", "/w/log/J.out.s1-42-r0"]
