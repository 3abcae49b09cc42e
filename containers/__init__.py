"""The docker test rig: registry-free node images and throw-away multi-node clusters.

Not part of the jobns distribution (pyproject lists only jobns.launcher, jobns.hook, jobns.schemas):
these modules run on the test host, drive dockerd through the docker SDK, and are
imported by tests/e2e.
"""
