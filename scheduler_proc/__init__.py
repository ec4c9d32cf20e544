"""The scheduler process: continuous batching and finish checks. Never imports mlx."""
