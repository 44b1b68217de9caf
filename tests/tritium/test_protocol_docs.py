"""docs/architecture.md's protocol tables are the ones the message types give, and name the current version."""

from __future__ import annotations

from tests.servers import PROJECT_ROOT
from tritium.protocol import PROTOCOL_VERSION
from tritium.protocol.messages import protocol_table


def test_the_protocol_tables_are_generated_from_the_message_types():
    """After changing a message type: ``python -m tritium.protocol`` prints the tables to paste."""
    text = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    assert protocol_table() in text


def test_the_protocol_section_names_the_current_version():
    text = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    assert f"## Wire protocol (`tritium/protocol/`, version {PROTOCOL_VERSION})" in text
