"""Wire protocol shared by every lazyserve process: messages, enums, codec, endpoints, config.

Nothing here imports mlx, torch, fastapi or transformers, so every process can import it.
"""

PROTOCOL_VERSION = 5
"""Bumped on any incompatible change to a message; checked in the Hello/Ready handshake."""
