"""Tensor parallel over `mx.distributed`: the group's setup and ports (`setup`), the rank
fan-out link (`link`) and the model's shards (`sharding`)."""
