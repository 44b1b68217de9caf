"""``python -m tritium.protocol``: the protocol tables of docs/architecture.md, from the message types."""

from tritium.protocol.messages import protocol_table

print(protocol_table(), end="")
