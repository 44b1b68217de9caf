"""Raw HTTP for the tests that must send what no well-behaved client sends."""

from __future__ import annotations

import http.client
import json


def request(url: str, method: str, path: str, body: bytes | str | dict | None = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    result = (response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    connection.close()
    return result


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]
