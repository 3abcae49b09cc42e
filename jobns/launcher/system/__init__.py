"""The kernel and the host: system calls, mounts, processes, the host's programs and
jobns's own files under state_dir. Nothing here knows what a job is."""
