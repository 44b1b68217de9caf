"""Reading a server's Prometheus text: every sample by name and labels."""

from __future__ import annotations

import re
import urllib.request

SAMPLE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')


def scrape(server) -> tuple[str, dict]:
    with urllib.request.urlopen(server.metrics_url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")))
            samples[(match.group(1), labels)] = float(match.group(3))
    return text, samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
