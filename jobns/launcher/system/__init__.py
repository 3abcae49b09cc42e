"""The kernel and the host: system calls, mounts, processes, the host's programs. Nothing
here knows what a job is."""
