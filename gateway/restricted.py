"""Triton's restricted APIs: ``--http-restricted-api`` and ``--grpc-restricted-protocol``.

Each flag, ``<category>,<category>...:<key>=<value>``, makes the calls of those API
categories need a header ``<key>: <value>`` (on gRPC the metadata key is
``triton-grpc-protocol-<key>``). A call without it is refused with Triton's words: HTTP
403 ``This API is restricted, expecting header '<key>'``, gRPC UNAVAILABLE ``This protocol
is restricted, expecting header 'triton-grpc-protocol-<key>'``. A category may be in one
group of a flag only; Triton refuses to start otherwise, and so does tritium, with its
message. Which route or RPC belongs to which category is a table in each front end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tritium.errors import InvalidArgument, Restricted

CATEGORIES = frozenset({"health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
                        "statistics", "trace", "logging"})


@dataclass(frozen=True)
class RestrictionFlag:
    """How one of the two flags reads and refuses, in Triton's words."""

    option: str     # the flag, without its dashes
    noun: str       # Triton's word for a category in its startup errors
    prefix: str     # put before the key to make the header's name
    refusal: str    # the error a refused call gets


HTTP_FLAG = RestrictionFlag("http-restricted-api", "api", "", "This API is restricted, expecting header '{}'")
GRPC_FLAG = RestrictionFlag("grpc-restricted-protocol", "protocol", "triton-grpc-protocol-",
                            "This protocol is restricted, expecting header '{}'")


@dataclass(frozen=True)
class RestrictedApis:
    """Category -> (header, value) its calls must carry; empty: nothing is restricted."""

    rules: tuple[tuple[str, str, str], ...] = ()   # (category, header name as given, value)
    refusal: str = HTTP_FLAG.refusal

    def __bool__(self) -> bool:
        return bool(self.rules)

    def check(self, category: str | None, headers: Iterable[tuple]) -> None:
        """Raise Restricted unless ``headers`` (name, value pairs, str or bytes) carry the rule's."""
        for restricted, header, value in self.rules:
            if restricted == category:
                if not any(_text(name).lower() == header.lower() and _text(given) == value
                           for name, given in headers):
                    raise Restricted(self.refusal.format(header))
                return


def _text(item) -> str:
    return item.decode("latin-1") if isinstance(item, bytes) else item


def parse_restrictions(values: Iterable[str], flag: RestrictionFlag) -> RestrictedApis:
    """The rules of every ``--<flag>`` value; InvalidArgument with Triton's message if one is wrong."""
    rules: list[tuple[str, str, str]] = []
    for value in values:
        try:
            rules += _parse_one(value, flag, {rule[0] for rule in rules})
        except InvalidArgument as exc:
            raise InvalidArgument(f'Bad option: "--{flag.option}".\n{exc.message}') from None
    return RestrictedApis(tuple(rules), flag.refusal)


def _parse_one(value: str, flag: RestrictionFlag, taken: set[str]) -> list[tuple[str, str, str]]:
    categories, colon, setting = value.partition(":")
    key, equals, expected = setting.partition("=")
    if not (colon and equals and categories and key and expected):
        raise InvalidArgument(f"--{flag.option} option format is '<config name>:<setting>=<value>'. Got {value}")
    rules = []
    for category in categories.split(","):
        if category not in CATEGORIES:
            raise InvalidArgument(f"unknown restricted {flag.noun} '{category}'")
        if category in taken:
            raise InvalidArgument(f"restricted {flag.noun} '{category}' can not be specified in multiple config groups")
        taken.add(category)
        rules.append((category, flag.prefix + key, expected))
    return rules
