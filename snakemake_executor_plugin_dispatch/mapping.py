"""A Snakemake job as a dispatch job document, and a dispatch job's view as Snakemake's
outcome. Pure: values in, values out (no Snakemake object, no database).

``JobFacts`` holds what the executor reads off a Snakemake job; ``job_document`` turns
it into the document ``controller.client.Client.submit`` takes, refusing resources it
cannot honour (naming the rule and the key) rather than dropping them; ``job_policy``
is the recovery policy every job is submitted with (application failures are
Snakemake's ``--retries``, infrastructure failures the daemon's); ``outcome`` reads a
job's view back as success, failure (with the cause and exit code) or still active.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# label keys the executor sets on every job (user labels may not use them)
RUN_LABEL = "snakemake/run"
RULE_LABEL = "snakemake/rule"
JOBID_LABEL = "snakemake/jobid"
WILDCARDS_LABEL = "snakemake/wildcards"
ATTEMPT_LABEL = "snakemake/attempt"
OWN_LABELS = frozenset({RUN_LABEL, RULE_LABEL, JOBID_LABEL, WILDCARDS_LABEL, ATTEMPT_LABEL})

# Causes that are the application's: Snakemake's --retries decides (the daemon fails
# them at once), so a failed job is never run again by both.
APPLICATION_CAUSES = ("non-zero-exit", "signaled", "timeout", "out-of-memory", "deadline",
                      "missing-output")
# Causes that are the infrastructure's: the daemon's policy resubmits them (Snakemake
# never sees them unless the policy's budget runs out).
INFRASTRUCTURE_CAUSES = ("node-lost", "boot-failed", "preempted", "launch-failed", "lost")


class MappingError(ValueError):
    """A job (or a setting) the executor cannot submit as asked; the message says why."""


# ---------------------------------------------------------------- resources


class Use(enum.Enum):
    """What a resource key becomes."""

    MEMORY = "memory"  # resources.memory_mb
    TIME = "time"  # resources.time_limit_s
    CPUS = "cpus"  # resources.cpus_per_task
    NODES = "nodes"
    TASKS = "tasks"  # resources.tasks_per_node
    GPUS = "gpus"  # resources.gpus_per_node, or gres gpu:<model>:<n>
    PLACEMENT = "placement"  # extensions.slurm.Placement.<field>
    SLURM_RESOURCE = "slurm-resource"  # extensions.slurm.Resources.<field>
    UNUSED = "unused"  # known to Snakemake, nothing for Slurm (documented)


# key -> (use, field of the extension table where there is one)
RESOURCES: Mapping[str, tuple[Use, str]] = {
    "mem_mb": (Use.MEMORY, ""),
    "mem_mib": (Use.MEMORY, ""),
    "runtime": (Use.TIME, ""),
    "cpus_per_task": (Use.CPUS, ""),
    "nodes": (Use.NODES, ""),
    "tasks": (Use.TASKS, ""),
    "gpu": (Use.GPUS, ""),
    "gpu_model": (Use.GPUS, ""),
    "slurm_partition": (Use.PLACEMENT, "partition"),
    "slurm_account": (Use.PLACEMENT, "account"),
    "qos": (Use.PLACEMENT, "qos"),
    "constraint": (Use.PLACEMENT, "constraint"),
    "gres": (Use.SLURM_RESOURCE, "gres"),
    "mem_mb_per_cpu": (Use.SLURM_RESOURCE, "mem_per_cpu_mb"),
    # Snakemake's own bookkeeping and standard keys with no Slurm meaning here: _cores
    # and _nodes (the scheduler's), mem and disk (parsed into *_mb/*_mib), disk_* (sbatch
    # --tmp would need TmpDisk on the nodes), tmpdir (the job's own), gpu_manufacturer
    "_cores": (Use.UNUSED, ""),
    "_nodes": (Use.UNUSED, ""),
    "_job_count": (Use.UNUSED, ""),
    "mem": (Use.UNUSED, ""),
    "disk": (Use.UNUSED, ""),
    "disk_mb": (Use.UNUSED, ""),
    "disk_mib": (Use.UNUSED, ""),
    "tmpdir": (Use.UNUSED, ""),
    "gpu_manufacturer": (Use.UNUSED, ""),
}


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the executor reads off one Snakemake job (a rule's job or a group's)."""

    name: str  # the rule's name, or the group's
    rules: tuple[str, ...]
    jobid: str
    attempt: int
    threads: int
    resources: Mapping[str, Any]
    wildcards: Mapping[str, str]
    outputs: tuple[str, ...]
    is_group: bool = False


def _positive_int(facts: JobFacts, key: str, value: Any) -> int:
    """``value`` (a number, or text of one) rounded up; MappingError unless positive."""
    number = -1.0
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError, ValueError):
            number = float(value)
    if not number > 0 or math.isinf(number):
        raise MappingError(f"{_who(facts)}: resource {key}={value!r} must be a positive number")
    return math.ceil(number)


def _who(facts: JobFacts) -> str:
    return f"group {facts.name}" if facts.is_group else f"rule {facts.name}"


def _text(facts: JobFacts, key: str, value: Any) -> str:
    text = str(value)
    if not text.isprintable() or not text:
        raise MappingError(f"{_who(facts)}: resource {key}={value!r} must be printable text")
    return text


def mib_of_mb(mb: int) -> int:
    """Megabytes (10**6) as mebibytes (2**20), rounded up."""
    return math.ceil(mb * 10**6 / 2**20)


def resource_fields(facts: JobFacts, *, ignore: frozenset[str] = frozenset(),
                    ) -> tuple[dict[str, int], dict[str, Any]]:
    """``(resources, slurm extension)`` of the job document. A key that is neither
    mapped nor in ``ignore`` is refused (MappingError naming the rule and the key)."""
    res = dict(facts.resources)
    unknown = sorted(k for k in res if k not in RESOURCES and k not in ignore)
    if unknown:
        supported = ", ".join(sorted(k for k in RESOURCES if not k.startswith("_")))
        raise MappingError(
            f"{_who(facts)}: resource {unknown[0]!r} is not supported by the dispatch "
            f"executor (supported: {supported}; --dispatch-ignore-resources "
            f"{unknown[0]} submits the job without it)")
    out: dict[str, int] = {}
    placement: dict[str, str] = {}
    slurm_res: dict[str, Any] = {}
    cpus = res.get("cpus_per_task", facts.threads)
    if cpus is not None:
        out["cpus_per_task"] = _positive_int(facts, "cpus_per_task", cpus)
    if res.get("mem_mib") is not None:
        out["memory_mb"] = _positive_int(facts, "mem_mib", res["mem_mib"])
    elif res.get("mem_mb") is not None:
        out["memory_mb"] = mib_of_mb(_positive_int(facts, "mem_mb", res["mem_mb"]))
    if res.get("runtime") is not None:
        out["time_limit_s"] = 60 * _positive_int(facts, "runtime", res["runtime"])
    nodes = _positive_int(facts, "nodes", res["nodes"]) if res.get("nodes") is not None else 1
    if res.get("nodes") is not None:
        out["nodes"] = nodes
    if res.get("tasks") is not None:
        tasks = _positive_int(facts, "tasks", res["tasks"])
        if tasks % nodes:
            raise MappingError(f"{_who(facts)}: resource tasks={tasks} is not a multiple of "
                               f"nodes={nodes} (a dispatch job has tasks per node)")
        out["tasks_per_node"] = tasks // nodes
    if res.get("gpu") is not None:
        gpus = _positive_int(facts, "gpu", res["gpu"])
        if res.get("gpu_model") is not None:
            model = _text(facts, "gpu_model", res["gpu_model"])
            slurm_res["gres"] = f"gpu:{model}:{gpus}"
        else:
            out["gpus_per_node"] = gpus
    elif res.get("gpu_model") is not None:
        raise MappingError(f"{_who(facts)}: resource gpu_model needs gpu (how many)")
    for key, (use, name) in RESOURCES.items():
        value = res.get(key)
        if value is None:
            continue
        if use is Use.PLACEMENT:
            placement[name] = _text(facts, key, value)
        elif use is Use.SLURM_RESOURCE and key == "gres":
            if "gres" in slurm_res:
                raise MappingError(f"{_who(facts)}: resources gres and gpu_model both set "
                                   "the gres")
            slurm_res["gres"] = _text(facts, key, value)
        elif use is Use.SLURM_RESOURCE:
            slurm_res[name] = _positive_int(facts, key, value)
    if "mem_per_cpu_mb" in slurm_res:
        out.pop("memory_mb", None)  # sbatch refuses --mem with --mem-per-cpu
    slurm: dict[str, Any] = {}
    if placement:
        slurm["Placement"] = placement
    if slurm_res:
        slurm["Resources"] = slurm_res
    return out, slurm


# ---------------------------------------------------------------- labels and names


_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")


def label_value(text: str) -> str:
    """``text`` as a label value (``[A-Za-z0-9._-]``, at most 63, alphanumeric ends): as
    it is when it fits, else a readable part and 8 hex digits of its hash."""
    if _LABEL_VALUE.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:54].strip("._-")
    return f"{readable}-{digest}" if readable else digest


def parse_labels(text: str | None) -> dict[str, str]:
    """``k=v,k2=v2`` (``--dispatch-labels``) -> labels; the executor's own keys and
    values that are no labels are refused."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _LABEL_KEY.fullmatch(key):
            raise MappingError(f"--dispatch-labels: {part!r} is not key=value with a label key")
        if key in OWN_LABELS:
            raise MappingError(f"--dispatch-labels: {key} is set by the executor")
        if not _LABEL_VALUE.fullmatch(value):
            raise MappingError(f"--dispatch-labels: {key}: {value!r} is not a label value "
                               "(at most 63 of A-Z a-z 0-9 . _ -, alphanumeric ends)")
        out[key] = value
    return out


def run_identity(workdir: str, snakefile: str) -> str:
    """The run's identity: the same for every Snakemake started on this workflow in this
    directory (a restart finds its jobs by it), different for any other workflow.
    Snakemake's directory lock keeps two runs of one directory from running at once."""
    return hashlib.sha256(f"{workdir}\0{snakefile}".encode()).hexdigest()[:16]


def wildcards_text(wildcards: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in wildcards.items())


def display_name(facts: JobFacts) -> str:
    """The document's ``name``: rule (or group) and wildcards, one line, <= 256."""
    text = facts.name + (f" {wildcards_text(facts.wildcards)}" if facts.wildcards else "")
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)[:256]


def journal_key(facts: JobFacts) -> str:
    """What identifies a job across Snakemake restarts: its rule (or group) and the
    outputs it makes (a Snakemake job id is only unique within one run)."""
    text = "\0".join([facts.name, *sorted(facts.outputs)])
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- document and policy


@dataclass(frozen=True, slots=True)
class Submit:
    """How the executor submits every job of a run."""

    run_id: str
    workdir: str
    labels: Mapping[str, str]
    cluster: str | None = None
    ignore: frozenset[str] = frozenset()


def job_document(facts: JobFacts, *, command: str, log_base: str,
                 submit: Submit) -> dict[str, Any]:
    """The dispatch job document of one Snakemake job: ``command`` run by ``/bin/sh -c``
    in the workflow's directory; its stdout and stderr under ``log_base`` (``.out``,
    ``.err``); labels naming the run, rule, wildcards, job id and attempt."""
    resources, slurm = resource_fields(facts, ignore=submit.ignore)
    labels = dict(submit.labels)
    labels.update({
        RUN_LABEL: submit.run_id,
        RULE_LABEL: label_value(facts.name),
        JOBID_LABEL: label_value(facts.jobid),
        ATTEMPT_LABEL: str(facts.attempt),
    })
    if facts.wildcards:
        labels[WILDCARDS_LABEL] = label_value(wildcards_text(facts.wildcards))
    extensions: dict[str, Any] = {
        "dispatch": {"Output": {"stdout": f"{log_base}.out", "stderr": f"{log_base}.err"}}}
    if slurm:
        extensions["slurm"] = slurm
    doc: dict[str, Any] = {
        "name": display_name(facts),
        "labels": labels,
        "command": ["/bin/sh", "-c", command],
        "workdir": submit.workdir,
        "resources": resources,
        "extensions": extensions,
    }
    if submit.cluster:
        doc["cluster"] = submit.cluster
    return doc


def job_policy(user: Mapping[str, Any] | None) -> dict[str, Any]:
    """The recovery policy of every job: the user's (``--dispatch-policy``) with every
    application cause set to fail and no exit code retried, so Snakemake's --retries
    alone runs a failed application again; the infrastructure causes keep the user's
    rules, or the daemon's defaults. A user policy that resubmits an application
    failure is refused (both would run it again)."""
    doc = dict(user or {})
    causes = dict(doc.get("causes") or {})
    for name in APPLICATION_CAUSES:
        rule = causes.get(name)
        if isinstance(rule, Mapping) and (rule.get("action") == "resubmit"
                                          or (rule.get("budget") and "action" not in rule)):
            raise MappingError(
                f"--dispatch-policy: causes.{name} resubmits an application failure; "
                "Snakemake's --retries does that here (both would run the job again)")
        causes[name] = {"action": "fail"}
    if doc.get("retry_exit_codes"):
        raise MappingError("--dispatch-policy: retry_exit_codes resubmits application "
                           "failures; use Snakemake's --retries")
    doc["causes"] = causes
    doc["retry_exit_codes"] = []
    return doc


# ---------------------------------------------------------------- outcomes


class Ending(enum.Enum):
    ACTIVE = "active"
    SUCCESS = "success"
    FAILURE = "failure"


@dataclass(frozen=True, slots=True)
class Outcome:
    ending: Ending
    message: str = ""


ACTIVE = Outcome(Ending.ACTIVE)


def outcome(job_id: str, view: Mapping[str, Any] | None) -> Outcome:
    """Snakemake's outcome of a dispatch job's view (``JobView.to_json()``; None: no such
    job). Only ``succeeded`` is success; an ending the daemon has not yet decided
    (pending, held, running, and a job unknown to Slurm for now) is still active."""
    if view is None:
        return Outcome(Ending.FAILURE,
                       f"dispatch job {job_id} is not in the database (deleted?)")
    phase = view.get("phase")
    if phase == "succeeded":
        return Outcome(Ending.SUCCESS)
    if phase not in ("failed", "cancelled", "rejected"):
        return ACTIVE
    cause = view.get("cause") or "unknown"
    detail = view.get("cause_detail") or ""
    head = f"dispatch job {job_id} {phase}: cause {cause}" + (f" ({detail})" if detail else "")
    parts = [head]
    if view.get("exit_code") is not None:
        parts.append(f"exit code {view['exit_code']}")
    if view.get("slurm_job_id") is not None:
        where = f" on {view['nodes']}" if view.get("nodes") else ""
        parts.append(f"Slurm job {view['slurm_job_id']}{where}")
    if view.get("attempt"):
        parts.append(f"after {view['attempt']} resubmission(s) by the daemon")
    if phase == "rejected" and view.get("reason"):
        parts.append(f"reason: {view['reason']}")
    if view.get("warning"):
        parts.append("failed with a warning (the policy's on_exhausted is warn): "
                     "Snakemake --keep-going goes on without its outputs")
    return Outcome(Ending.FAILURE, "; ".join(parts) + ". ")


def log_files(log_base: str, names: Sequence[str]) -> list[str]:
    """The files among ``names`` (a directory listing) that hold the job's stdout and
    stderr under ``log_base`` (``<base>.out.s<N>-<slurm id>-r<R>``, ``.err`` the same),
    in name order."""
    stem = log_base.rsplit("/", 1)[-1]
    directory = log_base.rsplit("/", 1)[0] if "/" in log_base else "."
    return [f"{directory}/{n}" for n in sorted(names)
            if n.startswith((f"{stem}.out.s", f"{stem}.err.s"))]
