"""A job's states from setup to teardown: make, stage, release, sweep, usage."""
