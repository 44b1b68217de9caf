"""docs/architecture.md's protocol table names every message kind, with its number, and nothing else."""

from __future__ import annotations

import re

from tests.servers import PROJECT_ROOT
from tritium.protocol import PROTOCOL_VERSION, Kind


def test_the_protocol_table_lists_every_kind_once_with_its_number():
    text = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| ([A-Z_]+) \((\d+)\) \|", text, flags=re.MULTILINE)
    assert sorted(rows) == sorted((kind.name, str(int(kind))) for kind in Kind)


def test_the_protocol_section_names_the_current_version():
    text = (PROJECT_ROOT / "docs" / "architecture.md").read_text()
    assert f"## Wire protocol (`tritium/protocol.py`, version {PROTOCOL_VERSION})" in text
