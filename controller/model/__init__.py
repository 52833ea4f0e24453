"""Value types shared by every layer: ids, the job spec, refs and observations.

Pure data and validation only; nothing here performs I/O.
"""

from controller.model.ids import JobID, new_job_id, parse_job_id
from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    Source,
    StartRequest,
    State,
)
from controller.model.spec import (
    JobSpec,
    OutputSpec,
    Placement,
    Resources,
    SharedCheckpoint,
    SlurmResources,
    parse_job_document,
)

__all__ = [
    "Cause",
    "CauseKind",
    "JobID",
    "JobSpec",
    "ObjectObs",
    "ObjectRef",
    "OutputSpec",
    "Placement",
    "Provenance",
    "Resources",
    "SharedCheckpoint",
    "SlurmResources",
    "Source",
    "StartRequest",
    "State",
    "new_job_id",
    "parse_job_document",
    "parse_job_id",
]
