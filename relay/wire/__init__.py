"""Sans-I/O MySQL wire protocol: framing, primitives, handshake, replies. Bytes only."""
