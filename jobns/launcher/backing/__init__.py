"""What holds a job's trees: directories on the node, their disk images and size
limits."""
