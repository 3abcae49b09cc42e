"""The job's mount namespace: making and joining it, the binds, the holder that
pins it, [[dirs]] and CDI entries."""
