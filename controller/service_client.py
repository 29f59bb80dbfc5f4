"""What every controller-side service client shares (controller/clients.py has the three roles'):
gRPC failures turned into rlfleet errors that name the service, its address and the RPC, and the
client's two channels: the blocking one its threads call on, and the asyncio one (made on the
controller's event loop) with its connection watch.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator

import grpc
import grpc.aio

from rlfleet import types as t
from rlfleet.errors import Busy, PeerSilent, RlfleetError, ServiceUnavailable, WeightSyncError
from rlfleet.proto.v1 import common_pb2
from rlfleet.rpc import convert
from rlfleet.rpc.aio_channel import AioChannel, open_aio_channel
from rlfleet.rpc.call_release import release_call
from rlfleet.rpc.channel import REPORT_EVERY_S, keepalive_options, wait_until_serving
from rlfleet.rpc.security import Security

_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
# How grpc words a call failed by an unanswered keepalive ping (1.85: "Stream removed (ping timeout)";
# older releases: "keepalive watchdog timeout")
_SILENT_WORDS = ("ping timeout", "keepalive watchdog timeout")


def translate_rpc_error(role: str, address: str, rpc: str, err: grpc.RpcError) -> RlfleetError:
    code = err.code() if hasattr(err, "code") else None
    detail = err.details() if hasattr(err, "details") else str(err)
    message = f"{role} service at {address}: {rpc} failed with {code.name if code else '?'}: {detail}"
    if code == grpc.StatusCode.UNAVAILABLE and any(words in (detail or "") for words in _SILENT_WORDS):
        return PeerSilent(message)
    if code in _UNREACHABLE:
        return ServiceUnavailable(message)
    if code == grpc.StatusCode.ABORTED:
        return WeightSyncError(message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and detail.startswith("Busy:"):
        return Busy(message)  # another weight operation runs there: worth a retry once it ends
    return RlfleetError(message)


# How grpc words a call on a channel this process closed: a unary call, a stream
_CLOSED_WORDS = ("closed channel", "Channel closed")


def closed_error(role: str, address: str, rpc: str) -> ServiceUnavailable:
    return ServiceUnavailable(f"{role} service at {address}: {rpc} failed: the channel was closed "
                              "(the replica left the fleet or rejoined)")


@contextlib.contextmanager
def rpc_errors(client: ServiceClient, rpc: str) -> Iterator[None]:
    """gRPC failures inside become rlfleet errors naming the service, its address and the RPC.

    The fleet closes a member's channel when it leaves or rejoins after a restart, while a thread may
    still be asking the old member: to that thread the replica is as unreachable as a dead one. A call
    on a channel the client closed is refused before grpc sees it (grpc raises a bare ValueError, and a
    stream started on a closed channel that never carried one crashed the process, issue 34)."""
    if client.closed:
        raise closed_error(client.role, client.address, rpc)
    try:
        yield
    except grpc.RpcError as err:
        release_call(err)  # a failed Generate stream: freed with the error, not at the final collection
        raise translate_rpc_error(client.role, client.address, rpc, err) from None
    except ValueError as err:  # closed by another thread during the call
        if not any(words in str(err) for words in _CLOSED_WORDS):
            raise
        raise closed_error(client.role, client.address, rpc) from None


def rpc(fn: Callable) -> Callable:
    """A client method whose gRPC failures become rlfleet errors naming the service (rpc_errors)."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with rpc_errors(self, fn.__name__):
            return fn(self, *args, **kwargs)
    return wrapper


class ServiceClient:
    role = ""
    stub_class: Callable = object  # the service's generated stub, made on the asyncio channel

    def __init__(self, address: str, timeout_s: float, connect_timeout_s: float = 60.0, alive=lambda: True,
                 security: Security | None = None, report_every_s: float | None = REPORT_EVERY_S,
                 keepalive: bool = False):
        """`security`: the job's TLS and bearer token (None: plain gRPC); `report_every_s`: how often the
        wait for the service says so (None: never, for a short check whose failure is reported anyway);
        `keepalive`: the channel pings the service while a call is open (rlfleet.rpc.channel
        keepalive_options), so a call to a service that stops answering fails (PeerSilent) within
        KEEPALIVE_S + KEEPALIVE_TIMEOUT_S rather than at its deadline."""
        self.address = address
        self.timeout_s = timeout_s
        self.closed = False
        self.keepalive = keepalive
        self.security = security
        self.extra_options = keepalive_options() if keepalive else None
        self.channel = wait_until_serving(address, self.role, connect_timeout_s, alive, security,
                                          report_every_s=report_every_s if report_every_s else float("inf"),
                                          extra_options=self.extra_options)
        self._aio: AioChannel | None = None  # calls made on the controller's event loop
        self._aio_loop: asyncio.AbstractEventLoop | None = None
        self._aio_stub = None  # the stub on self._aio, made once a channel (not once a call)
        # With keepalive, the asyncio channel's connection is pinged even with no call open, so it stays
        # READY only while the service answers: `connected` follows it (_watch_connection), and the
        # fleet's heartbeat asks no status of a member whose connection is READY (issue 44)
        self.connected = False
        # Times that connection left READY (lost, or closed), or the channel was replaced: what a call
        # learned of the service's process before may be another process's now (RolloutClient.kept_status)
        self.connection_losses = 0
        self._connection_watch: asyncio.Task | None = None

    @rpc
    def status(self, timeout_s: float = 10.0) -> t.ServiceStatus:
        return convert.status_from_proto(self._stub.GetStatus(common_pb2.GetStatusRequest(),
                                                              timeout=timeout_s))

    def close(self) -> None:
        self.closed = True
        self.connected = False
        self.connection_losses += 1
        self.channel.close()
        self._close_streams()

    # ---- calls on an event loop (controller/stream_loop.py) -------------------------------------
    def _aio_channel(self, rpc: str) -> AioChannel:
        """The asyncio channel, with the same options as the blocking one (TLS, token, keepalive,
        request ids), opened on first use on the running loop (grpc.aio binds a channel to it)."""
        if self.closed:
            raise closed_error(self.role, self.address, rpc)
        loop = asyncio.get_running_loop()
        if self._aio is None or self._aio_loop is not loop:
            if self._aio is not None:  # a new connection, maybe to another process than the old one's
                self.connection_losses += 1
            self._aio = open_aio_channel(self.address, self.security, self.extra_options)
            self._aio_loop = loop
            self._aio_stub = self.stub_class(self._aio)
            if self.keepalive:
                self._connection_watch = loop.create_task(self._watch_connection(self._aio))
            if self.closed:  # close() ran meanwhile, on another thread, before this channel existed
                self._close_streams()
                raise closed_error(self.role, self.address, rpc)
        return self._aio

    async def connect_async(self) -> None:
        """Opens the asyncio channel on the running loop now (a first Generate does so too) and, with
        keepalive, waits until `connected` says whether its connection came up (READY) or not."""
        self._aio_channel("connect")
        while self.keepalive and not self.connected and not self.connection_watch_done():
            await asyncio.sleep(0.01)

    def connection_watch_done(self) -> bool:
        """Whether the watch of the asyncio channel's connection ended (never started, or closed)."""
        return self._connection_watch is None or self._connection_watch.done()

    def _aio_stub_for(self, rpc: str):
        """The service's stub on the asyncio channel (opened if need be); its calls carry the
        request id, the step and the token (rlfleet.rpc.aio_channel.AioChannel)."""
        self._aio_channel(rpc)
        return self._aio_stub

    async def _watch_connection(self, channel: AioChannel) -> None:
        """Keeps `connected` true while `channel` is READY, until it closes; a connection lost (its
        pings unanswered for KEEPALIVE_TIMEOUT_S, or closed by the peer) is asked for again at once, so
        a replica that answers again is watched again. Woken only by a change of state: no polling.
        A channel replaced by one on another loop stops speaking for the client. Every departure from
        READY counts in `connection_losses`, however soon the connection comes back: the state it
        went back to may already be READY again, to a replica restarted at the same address."""
        ready, shutdown = grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.SHUTDOWN
        try:
            state = channel.get_state(try_to_connect=True)
            while state != shutdown and not self.closed and channel is self._aio:
                self.connected = state == ready
                await channel.wait_for_state_change(state)
                if state == ready and channel is self._aio:
                    self.connection_losses += 1
                state = channel.get_state(try_to_connect=True)
        finally:
            if channel is self._aio:
                self.connected = False

    @contextlib.contextmanager
    def _aio_errors(self, rpc: str) -> Iterator[None]:
        """As rpc_errors, for a call on the asyncio channel: its failures translated alike."""
        try:
            yield
        except grpc.RpcError as err:
            if self.closed:  # its channel closed under it: the service left or the run stops
                raise closed_error(self.role, self.address, rpc) from None
            raise translate_rpc_error(self.role, self.address, rpc, err) from None
        except grpc.aio.UsageError:  # the channel closed before the call started
            raise closed_error(self.role, self.address, rpc) from None
        except asyncio.CancelledError:
            # grpc.aio cancels the calls of a channel closed under them (a drain's timeout, a leave):
            # that is the service gone, as for a blocking call; the task's own cancellation goes on
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not self.closed:
                raise
            raise closed_error(self.role, self.address, rpc) from None

    def _close_streams(self) -> None:
        """Closes the asyncio channel on its loop (its open calls fail CANCELLED there), from any
        thread; a loop already stopped took its calls along."""
        channel, loop = self._aio, self._aio_loop
        if channel is None or loop is None or not loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(channel.close(), loop)
        except RuntimeError:  # the loop closed meanwhile
            pass

    async def close_streams(self) -> None:
        """Closes the asyncio channel, on its loop (the run stops), and lets its connection watch end
        before the loop stops (a task left pending there is reported when the loop is collected)."""
        if self._aio is not None:
            await self._aio.close()
        if self._connection_watch is not None:
            await asyncio.wait([self._connection_watch], timeout=1.0)
