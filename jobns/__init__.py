"""jobns: private /tmp, /var/tmp and /dev/shm for every batch job and container.

launcher/ is the program (its folders are the floors of the import graph, lowest first:
system, model, backing, mountns, lifecycle, commands), hook/ what other programs call,
schemas/ the contract. docs/development.md "Checks and code layout" has the map.
"""
