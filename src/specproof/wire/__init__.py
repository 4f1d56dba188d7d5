"""``specproof-engine/1``: certify engines in any language over JSON Lines (stdio or TCP).

- ``ExecEngine`` / ``TcpEngine``: an external engine as a specproof engine (the engine
  contract the suite consumes); ``engine_from_spec("exec:CMD ARGS" | "tcp:HOST:PORT")``;
- ``load_schema`` / ``validate_message``: the JSON Schema of every message (package data);
  ``field_tables()`` renders their fields as the Markdown tables in docs/protocol.md;
- ``encode_digest``: a state array as a ``state_digest`` entry (signed projections per slice);
- ``export_weights``: a reference target's weights as safetensors for a native engine;
- ``build_native`` / ``native_binary``: the C++ reference engine in ``native/`` (built out of the
  source tree, under ``~/.cache/specproof/native/``).

``python -m specproof.wire export-weights OUT.safetensors [--target trained]`` and
``python -m specproof.wire build-native`` are the command-line entries. See docs/protocol.md.
"""

from specproof.wire._client import (
    DEFAULT_TIMEOUT,
    ExecEngine,
    TcpEngine,
    WireEngine,
    WireTargetView,
    engine_from_spec,
)
from specproof.wire._digest import encode_digest
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._export import WEIGHTS_FORMAT, export_weights
from specproof.wire._native import (
    NativeBuildError,
    NativeToolchainError,
    build_native,
    native_binary,
    native_build_dir,
    native_dir,
)
from specproof.wire._schemas import (
    CLIENT_MESSAGES,
    ENGINE_MESSAGES,
    PROTOCOL,
    field_tables,
    load_schema,
    message_errors,
    validate_message,
)

__all__ = [
    "CLIENT_MESSAGES",
    "DEFAULT_TIMEOUT",
    "ENGINE_MESSAGES",
    "PROTOCOL",
    "WEIGHTS_FORMAT",
    "EngineProtocolError",
    "EngineRequestError",
    "ExecEngine",
    "NativeBuildError",
    "NativeToolchainError",
    "TcpEngine",
    "WireEngine",
    "WireTargetView",
    "build_native",
    "encode_digest",
    "engine_from_spec",
    "export_weights",
    "field_tables",
    "load_schema",
    "message_errors",
    "native_binary",
    "native_build_dir",
    "native_dir",
    "validate_message",
]
