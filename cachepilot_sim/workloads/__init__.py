"""Workload generators: synthetic returning sessions (trace readers attach here)."""
