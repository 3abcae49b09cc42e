"""jobns under Slurm's burst_buffer/lua: the job's shared part, set up and staged on the
controller before its nodes are allocated (docs/admin.md "The burst buffer")."""
