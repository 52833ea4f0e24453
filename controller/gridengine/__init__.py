"""The Grid Engine adapter (Son of Grid Engine 8.1.9; docs/gridengine.md is its contract)."""
