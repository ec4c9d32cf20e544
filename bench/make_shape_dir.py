"""Write a model directory with the default model's shape and no weights: config.json (from
the GGUF metadata) and the tokenizer files, for `--load-format dummy` on machines that
cannot receive the weights (the lent GPU).

    python bench/make_shape_dir.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(out: str) -> None:
    import mlx.core as mx

    from protocol.model_source import resolve_model
    from tokenizer_proc.hf_tokenizer import load_tokenizer
    from worker_proc.model_loader import gguf_config

    source = resolve_model(None)
    _, metadata = mx.load(source.path, return_metadata=True)
    metadata = dict(metadata)
    metadata["_tensor_names"] = set()
    config = gguf_config(metadata, Path(source.path))
    config["eos_token_id"] = 2
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    load_tokenizer(source).save_pretrained(str(path))
    print(f"wrote {path} ({config['num_hidden_layers']} layers, hidden {config['hidden_size']})")


if __name__ == "__main__":
    main(sys.argv[1])
