"""The node's file protocol: every name and format under state_dir, shared by the prolog
and epilog scripts, the helper, setup and teardown, `jobns run`, the OCI hook, gc and
the C modules Slurm loads (jobns/slurm/jobns_node.h reads what state.py writes)."""
