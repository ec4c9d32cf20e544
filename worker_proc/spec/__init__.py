"""Speculative decoding in the worker: the TARGET_VERIFY launch (`verify`)."""
