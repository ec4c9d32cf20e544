"""The model and its forward passes: loading (`loader`), the runner that builds each batch's lazy
graph (`runner`, `forward`, `running_batch`, `batched_prefill`, `decode_graph`), fused
projections, and the start-up warm-ups."""
