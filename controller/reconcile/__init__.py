"""Reconciliation: the recovery policy tables, the pure planner, and the tick that applies plans."""
