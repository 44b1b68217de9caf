"""How a wire message type is declared: fields with their short wire keys, compiled codecs.

A message type is a frozen, slotted dataclass whose fields each name their wire key::

    @message(Kind.RESET, "broker -> agent, instance")
    class Reset:
        boot: int | None = on_wire("boot", "the broker process's id")

``to_wire`` / ``from_wire`` / ``__init__`` are generated per type as straight-line code
(no loop over fields at run time), so that the hot-path kinds cost what a hand-built dict
costs. Adding an optional field is one line: a field with a default is left off the wire
while it holds that default, and read back as the default when absent.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

_REQUIRED = dataclasses.MISSING


@dataclasses.dataclass(frozen=True, slots=True)
class WireField:
    key: str                              # the short key on the wire
    doc: str                              # what it is, for docs/architecture.md's protocol table
    codec: Codec | None = None            # how its value crosses the wire, when not as it is


@dataclasses.dataclass(frozen=True, slots=True)
class Codec:
    """A value that is not sent as it is: ``encode`` to the wire form, ``decode`` back."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    shape: str = ""                       # how the docs table shows it ("{m, v, e}")


def on_wire(key: str, doc: str, default: Any = _REQUIRED, codec: Codec | None = None) -> Any:
    """A field of a message type: its wire key, its meaning, its default (absent: required)."""
    return dataclasses.field(default=default, metadata={"wire": WireField(key, doc, codec)})


def nested(record_type: type, many: bool = False) -> Codec:
    """A record type inside a message (one, or a list of them)."""
    shape = record_type.WIRE_SHAPE
    if many:
        return Codec(lambda items: [item.to_wire() for item in items],
                     lambda items: tuple(record_type.from_wire(item) for item in items), f"[{shape}]")
    return Codec(record_type.to_wire, record_type.from_wire, shape)


def _same(value: Any) -> Any:
    return value


# A tuple field: msgpack sends it as an array and reads it back as a list.
TUPLE = Codec(_same, tuple)


def lenient_enum(enum_type: type[enum.Enum]) -> Codec:
    """An enum sent as its value; a value this side does not know is kept as it came, so that the
    receiver can answer it with a clear error rather than fail to read the message."""
    members = {member.value: member for member in enum_type}
    return Codec(lambda member: member.value if isinstance(member, enum_type) else member,
                 lambda value: members.get(value, value))


def compile_wire_type(cls: type, kind: int | None = None, positional: bool = False) -> type:
    """Make ``cls`` a frozen, slotted dataclass with generated ``__init__``, ``to_wire`` and
    ``from_wire``; ``kind``: the record's ``k`` (None for a record nested in a message);
    ``positional``: sent as a list in field order rather than a dict (a compact table row)."""
    doc = cls.__dict__.get("__doc__")   # before dataclass() writes its signature there
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    cls.__doc__ = doc
    fields = dataclasses.fields(cls)
    namespace: dict[str, Any] = {"_cls": cls}
    init_params, init_body, required, optional, decoded = [], [], [], [], []
    for field in fields:
        wire: WireField = field.metadata["wire"]
        name = field.name
        # Frozen: assigned through the slot's own descriptor, a C call, not object.__setattr__.
        namespace[f"_set_{name}"] = getattr(cls, name).__set__
        init_body.append(f"    _set_{name}(self, {name})")
        value = f"self.{name}"
        if wire.codec is not None:
            namespace[f"_enc_{name}"], namespace[f"_dec_{name}"] = wire.codec.encode, wire.codec.decode
            value = f"_enc_{name}(self.{name})"
        if field.default is _REQUIRED:
            init_params.append(name)
            required.append((wire.key, value))
            read = f"wire[{wire.key!r}]" if not positional else f"wire[{len(decoded)}]"
            decoded.append(read if wire.codec is None else f"_dec_{name}({read})")
            continue
        namespace[f"_default_{name}"] = field.default
        init_params.append(f"{name}=_default_{name}")
        test = f"self.{name} is not None" if field.default is None else f"self.{name} != _default_{name}"
        optional.append((wire.key, value, test))
        if positional:
            raise TypeError(f"{cls.__name__}: a positional record has no optional fields")
        if wire.codec is None:
            decoded.append(f"wire.get({wire.key!r}, _default_{name})")
        else:
            decoded.append(f"(_dec_{name}(_v) if (_v := wire.get({wire.key!r})) is not None else _default_{name})")
    if positional:
        to_wire = ["def to_wire(self):", f"    return [{', '.join(value for _, value in required)}]"]
    else:
        entries = ([f"'k': {int(kind)}"] if kind is not None else []) + [f"{key!r}: {value}" for key, value in required]
        to_wire = ["def to_wire(self):", f"    wire = {{{', '.join(entries)}}}"]
        for key, value, test in optional:
            to_wire += [f"    if {test}:", f"        wire[{key!r}] = {value}"]
        to_wire.append("    return wire")
    source = "\n".join([
        f"def __init__(self, {', '.join(init_params)}):" if init_params else "def __init__(self):",
        *(init_body or ["    pass"]),
        *to_wire,
        "def from_wire(wire):",
        f"    return _cls({', '.join(decoded)})",
    ])
    exec(compile(source, f"<wire type {cls.__name__}>", "exec"), namespace)
    cls.__init__ = namespace["__init__"]
    cls.to_wire = namespace["to_wire"]
    cls.from_wire = staticmethod(namespace["from_wire"])
    cls.WIRE_FIELDS = tuple((field.name, field.metadata["wire"]) for field in fields)
    keys = [wire.key + (wire.codec.shape if wire.codec and wire.codec.shape else "") for _, wire in cls.WIRE_FIELDS]
    cls.WIRE_SHAPE = f"[{', '.join(keys)}]" if positional else f"{{{', '.join(keys)}}}"
    return cls


def record(cls: type | None = None, *, positional: bool = False):
    """Decorator: a record nested inside messages (a table row, an assignment)."""
    if cls is None:
        return lambda inner: compile_wire_type(inner, positional=positional)
    return compile_wire_type(cls)
