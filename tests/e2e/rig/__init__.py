"""Helpers for the docker rig tests: running jobs in node containers, in parallel."""
