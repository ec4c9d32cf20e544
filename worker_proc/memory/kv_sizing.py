"""How many tokens the KV pool gets: what the model can use, capped by the memory offered.

The memory comes from the device MLX runs on: on a CUDA GPU the device's free memory, on
Metal the recommended working set less what MLX holds, on the CPU the host's available
RAM (`memory_offered`). `size_pool` turns it into tokens (pure arithmetic, unit-tested).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIN_POOL_TOKENS = 16
"""Smallest pool derived from memory that the worker starts with."""


@dataclass(frozen=True)
class MemoryOffer:
    """Bytes the pool may draw from (before `--mem-fraction-static`) and where that number
    came from (for the start-up log)."""

    bytes: int
    source: str


def gpu_memory(info: dict[str, str | int], active_bytes: int) -> MemoryOffer:
    """What a GPU offers, from MLX's device info dict `info` and the bytes MLX has allocated
    (`active_bytes`): CUDA's ``free_memory`` (device-wide, so it already leaves out MLX's
    own allocations, which must not be subtracted again), else Metal's
    ``max_recommended_working_set_size`` less `active_bytes`. Raises `ValueError` when
    `info` has neither key."""
    if "free_memory" in info:
        return MemoryOffer(int(info["free_memory"]), "cuda free_memory")
    if "max_recommended_working_set_size" in info:
        return MemoryOffer(
            int(info["max_recommended_working_set_size"]) - active_bytes,
            "metal max_recommended_working_set_size - mlx active",
        )
    raise ValueError(f"the GPU's device info names no memory size (keys: {sorted(info)})")


def host_memory() -> MemoryOffer:
    """Available host RAM: MemAvailable (Linux), else free pages (sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return MemoryOffer(int(line.split()[1]) * 1024, "host MemAvailable")
    except OSError:
        pass
    return MemoryOffer(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), "host free pages")


def memory_offered() -> MemoryOffer:
    """What the device MLX runs on offers now (see the module doc). Call it after the
    weights are loaded and `mx.clear_cache()`, so that they are counted and freed buffers
    are not."""
    import mlx.core as mx

    if mx.default_device() != mx.gpu:
        return host_memory()
    info = mx.device_info(mx.gpu) if mx.cuda.is_available() else mx.metal.device_info()
    return gpu_memory(info, mx.get_active_memory())


@dataclass(frozen=True)
class PoolSize:
    """The pool's size in tokens, the bound that set it (``--max-total-tokens``, ``model``:
    max running requests x context length, or ``memory``: the fraction of the memory
    offered) and that bound's numbers in words, for the start-up log."""

    tokens: int
    bound: str
    reason: str


def size_pool(
    available_bytes: int,
    bytes_per_token: int,
    max_running_requests: int,
    context_length: int,
    mem_fraction: float,
    max_total_tokens: int | None,
) -> PoolSize:
    """Tokens for the KV pool.

    `max_total_tokens` when given (``--max-total-tokens``); else what the model can use,
    `max_running_requests` x `context_length` tokens, capped at `mem_fraction` of
    `available_bytes` divided by `bytes_per_token` (bytes of KV per token, all layers).
    No headroom is added for the radix cache: the pool holds both the running requests'
    tokens and the cached prefixes, and cached prefixes are evicted on demand, so a pool of
    that size lets every running request reach its full context; until they do, the rest
    of it holds cache.

    Raises `ValueError` when the memory bound leaves under `MIN_POOL_TOKENS` tokens.
    """
    if max_total_tokens:
        return PoolSize(max_total_tokens, "--max-total-tokens", "set by the flag")
    need = max_running_requests * context_length
    if not bytes_per_token:  # no attention layers: the pool only counts positions
        return PoolSize(
            need,
            "model",
            f"{max_running_requests} requests x {context_length} tokens of context, no KV memory (no attention layers)",
        )
    room = int(available_bytes * mem_fraction) // bytes_per_token
    memory = f"{mem_fraction} of {available_bytes / 2**30:.2f} GiB at {bytes_per_token} B/token = {room} tokens"
    model = f"{max_running_requests} requests x {context_length} tokens of context = {need} tokens"
    if need <= room:
        return PoolSize(need, "model", f"{model} (memory allows {memory})")
    if room < MIN_POOL_TOKENS:
        raise ValueError(
            f"--mem-fraction-static {mem_fraction} of {available_bytes} bytes leaves room for only "
            f"{room} KV tokens of {bytes_per_token} bytes"
        )
    return PoolSize(room, "memory", f"{memory} (the model could use {model})")
