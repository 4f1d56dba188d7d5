"""``specproof-engine/1``: certify engines in any language over JSON Lines (stdio or TCP).

- ``ExecEngine`` / ``TcpEngine``: an external engine as a specproof engine (the engine
  contract the suite consumes), both ``WireEngine`` s; ``engine_from_spec("exec:CMD ARGS" |
  "tcp:HOST:PORT")`` makes either, each message awaited at most ``$SPECPROOF_WIRE_TIMEOUT`` seconds
  (default ``DEFAULT_TIMEOUT``);
- ``EngineProtocolError`` (the engine broke the protocol) and ``EngineRequestError`` (it answered
  a request with ``error``);
- ``load_schema`` / ``validate_message`` / ``message_errors``: the JSON Schema of every message
  (package data); ``field_tables()`` renders their fields as the Markdown tables in docs/protocol.md;
- ``encode_digest``: a state array as a ``state_digest`` entry (signed projections per slice), for
  engines written in Python;
- ``encode_q_rows`` / ``decode_q_rows``: a sampling drafter's proposal rows as a ``draft`` message's
  sparse ``q`` and back (bounded; docs/protocol.md, Sampling); ``drafter_generator(sampling)``: the
  client's generator for the suite drafter's draws in a sampled request;
- ``die_with_parent`` / ``exit_with_parent``: tie a child process to its parent (Linux' death
  signal; a watchdog on the parent's sentinel), as every ``exec:`` engine is tied to its client.

``specproof.wire.native`` holds the C++ reference engine's build and the weights export
(``specproof native build|spec|export-weights`` on the command line). See docs/protocol.md.
"""

from specproof.wire._digest import encode_digest
from specproof.wire._drafts import drafter_generator
from specproof.wire._engine import DEFAULT_TIMEOUT, WireEngine
from specproof.wire._engines import ExecEngine, TcpEngine, engine_from_spec
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._lifetime import die_with_parent, exit_with_parent
from specproof.wire._q_rows import decode_q_rows, encode_q_rows
from specproof.wire._schemas import field_tables, load_schema, message_errors, validate_message

__all__ = [
    "DEFAULT_TIMEOUT",
    "EngineProtocolError",
    "EngineRequestError",
    "ExecEngine",
    "TcpEngine",
    "WireEngine",
    "decode_q_rows",
    "die_with_parent",
    "drafter_generator",
    "encode_digest",
    "encode_q_rows",
    "engine_from_spec",
    "exit_with_parent",
    "field_tables",
    "load_schema",
    "message_errors",
    "validate_message",
]
