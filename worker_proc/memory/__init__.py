"""The worker's memory: the KV pool (`kv_pool`) and its sizing (`kv_sizing`), the recurrent-state
pool (`state_pool`), and the per-layer caches the model reads them through (`layer_caches`)."""
