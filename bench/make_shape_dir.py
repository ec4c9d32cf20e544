"""Write a model directory with the default model's shape (or `--model`'s): config.json and
the tokenizer files, for `--load-format dummy` on machines that cannot receive the weights
(the lent GPU); with ``--weights real|random``, also model.safetensors (the weights as
lazyserve loads them, or random ones of the same architecture), so that mlx-lm and
mlx_lm.server can load the directory, e.g. the default model, a GGUF they cannot read.

    python bench/make_shape_dir.py OUT_DIR [--weights real|random] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE_FILE = "lazyserve_source.json"
"""What a directory was written from: {"model", "weights", "dtype"} (see `write_model_dir`)."""


def _shape_config(source) -> dict:
    """The model's config without loading its weights."""
    import mlx.core as mx

    from worker_proc.model_loader import gguf_config

    if source.kind != "gguf":
        return json.loads((Path(source.path) / "config.json").read_text())
    _, metadata = mx.load(source.path, return_metadata=True)
    metadata = dict(metadata)
    metadata["_tensor_names"] = set()
    return gguf_config(metadata, Path(source.path))


def write_model_dir(out: str | Path, model: str | None = None, weights: str | None = None) -> dict:
    """Write `model`'s (None: the default model) directory to `out`: config.json, tokenizer
    files, `SOURCE_FILE`, and for `weights` "real" or "random" model.safetensors in the dtype
    lazyserve computes in on this device (float32 on the CPU, bfloat16 on a GPU; an MLX-quantized
    directory stays quantized on a GPU). Returns the source record written. Raises
    `FileNotFoundError` / `ValueError` as `protocol.model_source.resolve_model` and
    `worker_proc.model_loader.load` do, and `ValueError` for another `weights`."""
    from mlx.utils import tree_flatten

    from protocol.model_source import resolve_model
    from tokenizer_proc.hf_tokenizer import load_tokenizer

    if weights not in (None, "real", "random"):
        raise ValueError(f"weights must be 'real' or 'random', got {weights!r}")
    source = resolve_model(model)
    tokenizer = load_tokenizer(source)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    record = {"model": model or "default", "weights": weights, "dtype": None}
    if weights is None:
        config = _shape_config(source)
    else:
        import mlx.core as mx

        from worker_proc.model_loader import load

        loaded = load(source, "auto" if weights == "real" else "dummy")
        tensors = dict(tree_flatten(loaded.model.parameters()))
        config = dict(loaded.config)
        if not any(k.endswith(".scales") for k in tensors):
            config.pop("quantization", None)
            config.pop("quantization_config", None)
        mx.save_safetensors(str(path / "model.safetensors"), tensors, metadata={"format": "mlx"})
        record["dtype"] = str(loaded.dtype)
    config.setdefault("eos_token_id", tokenizer.eos_token_id)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save_pretrained(str(path))
    (path / SOURCE_FILE).write_text(json.dumps(record))
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--model", default=None, help="GGUF file or model directory (default: the default model)")
    p.add_argument("--weights", choices=["real", "random"], default=None, help="also write model.safetensors")
    a = p.parse_args()
    record = write_model_dir(a.out, a.model, a.weights)
    config = json.loads((Path(a.out) / "config.json").read_text())
    print(f"wrote {a.out} ({config['num_hidden_layers']} layers, hidden {config['hidden_size']}; {record})")


if __name__ == "__main__":
    main()
