"""A run on disk: the workdir layout and lock, checkpoints, stage hand-off, preflight checks."""
