"""KV memory bookkeeping in the scheduler: slot allocator, request table, radix prefix cache.

Pure Python and numpy: the scheduler decides which slot holds which token; the worker only
reads and writes the KV stored at the slots it is told.
"""
