"""Staging: what a job stages (model), the moves and copies as the job user (transfer),
the stage-in and stage-out steps of a job's life (steps) and the site's pre-run and
post-run programs (programs)."""
