"""Fuzz campaign (hypothesis) over every input a job user or a container controls.

Each property says: whatever the input, the code returns or fails with one clean
``jobns:`` line (launcher.system.errors.JobnsError) -- never a traceback, never an exit status
that docs/command-line.md "Exit codes" does not document. ``JOBNS_FUZZ_EXAMPLES`` sets the examples
per property
(default 200, the CI profile); ``ci/fuzz`` runs the long campaign.
"""
