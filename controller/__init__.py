"""dispatch-controller: a reconciling controller that runs desired batch jobs on Slurm."""

__version__ = "0.1.0"
