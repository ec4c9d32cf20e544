"""KV pool sizing (`worker_proc.memory.kv_sizing`): the bounds, with values, and where the memory
figure comes from on each kind of device (no model, no MLX)."""

from __future__ import annotations

import pytest

from worker_proc.memory.kv_sizing import MIN_POOL_TOKENS, gpu_memory, host_memory, size_pool

GIB = 2**30
SMOLLM2_CPU = 46080
"""KV bytes per token of SmolLM2-135M in float32: 30 layers x 2 x 3 kv heads x 64 x 4."""


def test_the_model_bound_applies_when_memory_allows_more():
    size = size_pool(100 * GIB, SMOLLM2_CPU, 8, 2048, 0.2, None)
    assert (size.tokens, size.bound) == (8 * 2048, "model")
    assert "8 requests x 2048 tokens of context = 16384 tokens" in size.reason


def test_the_memory_bound_applies_when_the_model_could_use_more():
    # the default model with the default flags on this machine: 64 x 8192 tokens would take 22.5 GiB
    size = size_pool(24 * GIB, SMOLLM2_CPU, 64, 8192, 0.2, None)
    assert size.tokens == int(24 * GIB * 0.2) // SMOLLM2_CPU == 111848
    assert size.bound == "memory" and "64 requests x 8192 tokens" in size.reason


def test_the_bounds_meet_exactly():
    # half of 1,024,000 bytes at 512 B/token is 1000 tokens, which 10 requests x 100 tokens need
    exact = size_pool(1000 * 512 * 2, 512, 10, 100, 0.5, None)
    assert (exact.tokens, exact.bound) == (1000, "model")
    short = size_pool(1000 * 512 * 2 - 2, 512, 10, 100, 0.5, None)
    assert (short.tokens, short.bound) == (999, "memory")


def test_max_total_tokens_overrides_both_bounds():
    assert size_pool(1 * GIB, SMOLLM2_CPU, 64, 8192, 0.2, 123456).tokens == 123456
    assert size_pool(100 * GIB, SMOLLM2_CPU, 1, 16, 0.2, 4096).bound == "--max-total-tokens"


def test_too_little_memory_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match="--mem-fraction-static 0.2 .* only 15 KV tokens"):
        size_pool(15 * 1000 * 5, 1000, 64, 8192, 0.2, None)
    assert size_pool(MIN_POOL_TOKENS * 1000 * 5, 1000, 64, 8192, 0.2, None).tokens == MIN_POOL_TOKENS


def test_cuda_offers_its_device_wide_free_memory():
    info = {"device_name": "NVIDIA H200", "total_memory": 150 * GIB, "free_memory": 140 * GIB}
    offer = gpu_memory(info, active_bytes=GIB)
    assert (offer.bytes, offer.source) == (140 * GIB, "cuda free_memory")  # MLX's own use is already out of it


def test_metal_offers_its_working_set_less_what_mlx_holds():
    info = {"memory_size": 64 * GIB, "max_recommended_working_set_size": 48 * GIB}
    offer = gpu_memory(info, active_bytes=2 * GIB)
    assert offer.bytes == 46 * GIB and offer.source.startswith("metal")


def test_a_gpu_without_a_memory_figure_is_an_error():
    with pytest.raises(ValueError, match="names no memory size"):
        gpu_memory({"device_name": "x"}, 0)


def test_the_host_offers_memavailable():
    meminfo = open("/proc/meminfo").read()
    kib = next(int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemAvailable:"))
    offer = host_memory()
    assert offer.source == "host MemAvailable"
    assert abs(offer.bytes - kib * 1024) < 512 * 2**20  # read a moment apart
