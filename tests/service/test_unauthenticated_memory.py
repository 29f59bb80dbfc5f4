"""A caller without the token cannot make a server hold a large message (issue 15).

A real server process with a token; four 200 MB requests without it, at once. The server
used to receive each whole message before refusing it (RSS 269 -> 1,296 MB for four). Now
the refusal is sent from the request's headers and the message is never read: the server's
RSS grows by at most what HTTP/2 flow control lets a peer send ahead.
"""
from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import psutil
import pytest

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

TOKEN = "memory-test-token-0123456789"
SERVER = f"""
import time
from rlfleet.rpc.security import Security
from rlfleet.rpc.server import ServiceServer
from services.reward.servicer import RewardServicer, SERVICE_NAME
from rlfleet.proto.v1 import reward_pb2_grpc
server = ServiceServer([SERVICE_NAME], "127.0.0.1", 0, security=Security(token={TOKEN!r}))
server.add(reward_pb2_grpc.add_RewardServicer_to_server, RewardServicer())
server.start()
print("PORT", server.port, flush=True)
time.sleep(600)
"""


def test_large_requests_without_the_token_are_not_buffered():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("PORT "):
            line = proc.stdout.readline()
        address = f"127.0.0.1:{int(line.split()[1])}"
        server = psutil.Process(proc.pid)
        before = server.memory_info().rss
        payload = b"\0" * (200 << 20)
        options = [("grpc.max_send_message_length", 512 << 20)]

        def send(_):
            with grpc.insecure_channel(address, options=options) as channel:
                try:
                    channel.unary_unary("/rlfleet.v1.Reward/Score")(payload, timeout=60)
                except grpc.RpcError as err:
                    return err.code()
            return grpc.StatusCode.OK

        peak = before
        with ThreadPoolExecutor(4) as pool:
            sends = [pool.submit(send, i) for i in range(4)]
            # sampled until every send has its answer (at least 3 s): on a loaded machine the payloads
            # can still be arriving after a fixed few seconds
            deadline, at_least = time.monotonic() + 120, time.monotonic() + 3
            while time.monotonic() < deadline and (time.monotonic() < at_least
                                                   or not all(s.done() for s in sends)):
                peak = max(peak, server.memory_info().rss)
                time.sleep(0.02)
            codes = [s.result() for s in sends]
        peak = max(peak, server.memory_info().rss)
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 4, codes
        growth_mb = (peak - before) / 2**20
        print(f"server RSS {before / 2**20:.0f} MB -> peak {peak / 2**20:.0f} MB for 4 x 200 MB "
              "unauthenticated")
        assert growth_mb < 100, growth_mb
    finally:
        proc.kill()
        proc.wait()
