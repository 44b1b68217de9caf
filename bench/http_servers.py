"""Which HTTP server library the gateway uses: candidates measured on a small infer request.

Each candidate answers POST /v2/models/m/infer with a canned 150-byte JSON response after
reading the body (the part of the gateway's work that the library does), running alone
in one process on uvloop, driven by tritium perf's load generator at concurrency 8 and
64. Reported: requests/s and the server process's CPU per request.

    python bench/http_servers.py [--duration 4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import uvloop

from bench.harness import ROOT, cpu_seconds, free_port, save, table
from tritium.perf.loadgen import Workload, run_level

BODY = (b'{"model_name":"add_sub","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"FP32",'
        b'"shape":[1,16],"parameters":{"binary_data_size":64}}]}' + b"\0" * 64)
REQUEST_BODY = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[' + b"1.0," * 15 + b"1.0]}]}"

SERVERS = {
    "uvicorn (httptools, bare ASGI)": "uvicorn_plain",
    "tritium's gateway server (gateway/http_server.py, on httptools)": "tritium",
    "aiohttp (low-level web.Server)": "aiohttp_lowlevel",
    "aiohttp (web.Application)": "aiohttp_app",
}

CHILD = r'''
import asyncio, sys, uvloop
kind, port = sys.argv[1], int(sys.argv[2])
BODY = %r
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]

async def asgi(scope, receive, send):
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})

if kind == "tritium":
    import socket
    from tritium.gateway.http_server import HttpSettings, HttpResponse, HttpServer

    class App:
        def handle(self, request, answer):
            answer(HttpResponse(200, HEADERS[:1], BODY))

    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        sock.listen(2048)
        sock.setblocking(False)
        await HttpServer(App(), HttpSettings(max_body_bytes=1 << 26)).start(sock)
        await asyncio.Event().wait()

    uvloop.run(main())
elif kind.startswith("uvicorn"):
    import uvicorn
    config = uvicorn.Config(asgi, host="127.0.0.1", port=port, http="httptools", loop="uvloop",
                            lifespan="off", access_log=False, log_level="warning", proxy_headers=False,
                            server_header=False, date_header=False)
    uvicorn.Server(config).run()
else:
    from aiohttp import web

    async def handle(request):
        await request.read()
        return web.Response(body=BODY, content_type="application/json")

    async def main():
        if kind == "aiohttp_lowlevel":
            server = web.Server(handle, access_log=None)
            runner = web.ServerRunner(server)
        else:
            app = web.Application()
            app.router.add_post("/v2/models/{m}/infer", handle)
            runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.run(main())
''' % BODY


def measure(kind: str, duration_s: float) -> dict:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", CHILD, kind, str(port)], cwd=ROOT)
    try:
        time.sleep(1.5)
        request = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(REQUEST_BODY)) + REQUEST_BODY
        workload = Workload("127.0.0.1", port, request)
        results = {}
        for concurrency in (8, 64):
            before = cpu_seconds(process.pid)
            level = uvloop.run(run_level(workload, concurrency, duration_s=duration_s, warmup_s=0.5))
            used = cpu_seconds(process.pid) - before
            results[concurrency] = {"req_per_s": level.throughput, "errors": level.errors,
                                    "cpu_us_per_request": used / max(1, level.completed) * 1e6}
        return results
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args()
    results = {name: measure(kind, args.duration) for name, kind in SERVERS.items()}
    save("http_servers", results)
    rows = [[name, round(r[8]["req_per_s"]), round(r[64]["req_per_s"]), round(r[64]["cpu_us_per_request"]),
             r[8]["errors"] + r[64]["errors"]] for name, r in results.items()]
    print(table(["server", "req/s c=8", "req/s c=64", "CPU us/request c=64", "errors"], rows))


if __name__ == "__main__":
    main()
