"""A run's state on disk: the folder's layout, checkpoints (one process's file, several
processes' sharded folder, kept and pending ones, the position inside an epoch, the per-class
optimizer state), their writing during training, preemption, and reading them back once."""
