"""The Slurm adapter (SPEC §2-5): pure naming, holds, script rendering, dialect parsing
and classification, plus ``adapter.py``, the operations that run commands through a runner."""
