"""Speculative decoding in the scheduler (issue 42): who drafts, what, and when.

`ngram` proposes draft tokens from a request's own prompt and output (prompt lookup,
model-free); `policy` keeps each request's draft length from its recent acceptance and
turns speculation off for a batch size where it measured slower than plain decoding;
`speculator.Speculator` joins them for `Scheduler`. The worker verifies the drafts in a
TARGET_VERIFY launch (`worker_proc.spec.verify`).
"""
