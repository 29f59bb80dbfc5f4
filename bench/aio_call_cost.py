"""The client CPU of a grpc.aio call (issue 44): per unary call by request size and calls in flight, and
per message of a server stream, with the request id / step / token headers added three ways:

  interceptors  grpc.aio client interceptors (what rlfleet.rpc.aio_channel did before)
  metadata      `metadata=` on each call (rlfleet.rpc.aio_channel.AioChannel, now)
  none          no headers at all: grpc.aio's own floor

The server is a real grpc.aio server in a child process (so its CPU is not counted); the client is a
real grpc.aio channel on this process's event loop. `cpu` is this process's (every thread: grpc's
own pollers included), as bench/fleet_sim.py reads the controller's from /proc; `loop` the event
loop's thread alone (what holds the GIL there, as the controller's one loop does).

    PYTHONPATH=$PWD .venv/bin/python bench/aio_call_cost.py [--calls 2000] [--repeats 3]

Measured 2026-12-05 on the 2-core dev machine (load 1.2-1.9), microseconds of the loop's thread (of the
process), two repeats:
  unary 1 KB, 1 in flight     interceptors 197-199 (306-312)  metadata 159-170 (267-270)  none 150-157
  unary 32 KB, 1 in flight    interceptors 214-234 (320-336)  metadata 189-192 (289-294)  none 150-161
  unary 256 KB, 8 in flight   interceptors 319-326 (423-428)  metadata 250-263 (343-358)  none 213-248
  stream, 8 messages of 512 B, per message   34-35 (69-70) all three ways alike (noise: +-2)
  stream, 2000 messages, per message         11-13 (23-33) all three ways alike
A unary call's cost is nearly all fixed (grpc_call_start_batch and the call's creation run in C under
the GIL on the loop's thread, then its completion comes back through the loop): ~150 us for 1 KB,
+~0.3 us a KB. The interceptors cost ~40 us a unary call and nothing measurable a stream message.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import grpc
import grpc.aio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rlfleet.rpc.aio_channel import AioChannel, CallHeaders  # noqa: E402

UNARY = "/bench.Cost/Unary"
STREAM = "/bench.Cost/Stream"
REPLY_BYTES = 2048  # a Score reply of ~60 results is about this


# ---- server (child process) -------------------------------------------------------------------------

async def _serve() -> None:
    async def unary(request: bytes, context) -> bytes:
        return b"r" * REPLY_BYTES

    async def stream(request: bytes, context):
        count, size = struct.unpack("<II", request)
        message = b"m" * size
        for _ in range(count):
            yield message

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Cost", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


# ---- client ------------------------------------------------------------------------------------------

class _HeaderInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """The old way: the same headers added by an interceptor (one object per kind of call, as grpc.aio
    files an interceptor under the first kind it is an instance of)."""

    def __init__(self, headers: CallHeaders) -> None:
        self._headers = headers

    def _details(self, details):
        return grpc.aio.ClientCallDetails(details.method, details.timeout, self._headers(details.metadata),
                                          details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _StreamHeaderInterceptor(_HeaderInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


def _channel(address: str, way: str):
    options = [("grpc.max_send_message_length", 64 << 20)]
    headers = CallHeaders("0123456789abcdef0123456789abcdef")
    if way == "interceptors":
        interceptors = [_StreamHeaderInterceptor(headers), _HeaderInterceptor(headers)]
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    channel = grpc.aio.insecure_channel(address, options=options)
    return AioChannel(channel, headers) if way == "metadata" else channel


async def _unary(address: str, way: str, request_bytes: int, in_flight: int, calls: int) -> dict:
    channel = _channel(address, way)
    call = channel.unary_unary(UNARY)
    request = b"q" * request_bytes
    per_task = calls // in_flight

    async def caller(n: int) -> None:
        for _ in range(n):
            await call(request, timeout=30)

    try:
        await caller(50)  # connected and warm
        cpu0, loop0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        await asyncio.gather(*(caller(per_task) for _ in range(in_flight)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        loop_cpu = time.thread_time() - loop0
    finally:
        await channel.close()
    done = per_task * in_flight
    return {"kind": "unary", "way": way, "request_bytes": request_bytes, "in_flight": in_flight,
            "cpu_us_per_call": round(cpu / done * 1e6, 1),
            "loop_us_per_call": round(loop_cpu / done * 1e6, 1),
            "wall_us_per_call": round(wall / done * 1e6, 1)}


async def _stream(address: str, way: str, message_bytes: int, messages: int, streams: int,
                  total: int) -> dict:
    """`streams` streams open at once, each of `messages` messages, again until `total` messages came."""
    channel = _channel(address, way)
    call = channel.unary_stream(STREAM)
    request = struct.pack("<II", messages, message_bytes)

    async def one(rounds: int) -> int:
        return sum([sum([1 async for _ in call(request, timeout=60)]) for _ in range(rounds)])

    try:
        await one(1)
        rounds = max(1, total // (messages * streams))
        cpu0, loop0 = time.process_time(), time.thread_time()
        got = sum(await asyncio.gather(*(one(rounds) for _ in range(streams))))
        cpu, loop_cpu = time.process_time() - cpu0, time.thread_time() - loop0
    finally:
        await channel.close()
    return {"kind": "stream", "way": way, "message_bytes": message_bytes, "messages": messages,
            "streams": streams,
            "cpu_us_per_message": round(cpu / got * 1e6, 2),
            "loop_us_per_message": round(loop_cpu / got * 1e6, 2)}


async def _client(address: str, args) -> None:
    ways = ["interceptors", "metadata", "none"]
    for _ in range(args.repeats):
        for size in args.request_bytes:
            for in_flight in args.in_flight:
                for way in ways:  # side by side, the ways alternating
                    print(json.dumps(await _unary(address, way, size, in_flight, args.calls)), flush=True)
        for size in args.message_bytes:
            for messages in args.messages:
                for way in ways:
                    print(json.dumps(await _stream(address, way, size, messages, args.streams,
                                                   args.stream_total)), flush=True)
    # The headers alone (a call's share of the metadata way): fresh request id, no step bound
    headers = CallHeaders("0123456789abcdef0123456789abcdef")
    t0 = time.process_time()
    for _ in range(100_000):
        headers()
    print(json.dumps({"kind": "headers", "cpu_us_per_call": round((time.process_time() - t0) * 10, 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--request-bytes", type=int, nargs="+", default=[1024, 16384, 65536, 262144])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--message-bytes", type=int, nargs="+", default=[512])
    parser.add_argument("--messages", type=int, nargs="+", default=[8, 2000],
                        help="a stream's messages (8: a Generate of 8 prompts, as in bench/fleet_sim.py)")
    parser.add_argument("--stream-total", type=int, default=16000, help="messages a stream case reads")
    parser.add_argument("--streams", type=int, default=8, help="streams open at once")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        asyncio.run(_client(f"127.0.0.1:{port}", args))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
