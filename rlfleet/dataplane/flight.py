"""The data plane on Apache Arrow Flight: a replica's PayloadServer serves its store; a PayloadClient
(the learner's) fetches groups by request id and releases them.

A ticket is the JSON list of request ids; the stream is the payload table (payload.py). Actions:
`release` (body: JSON ids) forgets groups once trained. A server whose store stages puts (the
learner's, staging.py) also takes DoPut: a payload table the replicas push as groups are generated,
its descriptor naming the replica's data-plane address. The same rlfleet.rpc.security.Security as
the gRPC services: TLS with the fleet's certificates (mutual when asked) and the bearer token, which
every call must carry (`authorization: Bearer <token>`) or is refused before it reaches the store.
"""
from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.flight as fl

from rlfleet.errors import DataError, InvalidRequest, RlfleetError, ServiceUnavailable
from rlfleet.rpc.security import Security
from rlfleet.dataplane.payload import SCHEMA, TokenPayload, from_table, to_table
from rlfleet.dataplane.staging import StagingFull, StagingStore
from rlfleet.dataplane.store import PayloadMissing, PayloadStore

_MISSING = "payload missing: "
_FULL = "staging full: "


class _TokenCheck(fl.ServerMiddlewareFactory):
    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info, headers):
        given = (headers.get("authorization") or [""])[0]
        if not hmac.compare_digest(given.encode(), self._expected):
            raise fl.FlightUnauthenticatedError("the data plane needs the fleet's token "
                                                "(authorization: Bearer <token>)")
        return None


def _ids(body: bytes) -> list[str]:
    try:
        ids = json.loads(body)
    except ValueError as exc:
        raise fl.FlightServerError(f"bad ticket: {exc}") from exc
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise fl.FlightServerError("bad ticket: a JSON list of request ids is expected")
    return ids


class PayloadServer(fl.FlightServerBase):
    """Serves `store` at host:port (0: a free port, see .address) until shutdown()."""

    def __init__(self, store: PayloadStore, host: str = "127.0.0.1", port: int = 0,
                 security: Security | None = None):
        security = security or Security()
        scheme = "grpc+tls" if security.tls else "grpc+tcp"
        super().__init__(
            f"{scheme}://{host}:{port}",
            tls_certificates=[(security.cert, security.key)] if security.tls else None,
            verify_client=bool(security.tls and security.require_client_cert),
            root_certificates=security.ca if security.tls and security.require_client_cert else None,
            middleware={"token": _TokenCheck(security.token)} if security.token else None)
        self.store = store
        self.address = f"{host}:{self.port}"

    def do_get(self, context, ticket):
        try:
            groups = self.store.get(_ids(ticket.ticket))
        except PayloadMissing as exc:
            raise fl.FlightServerError(_MISSING + str(exc)) from exc
        return fl.RecordBatchStream(to_table(groups))

    def do_put(self, context, descriptor, reader, writer):
        if not isinstance(self.store, StagingStore):
            raise fl.FlightServerError("this data plane server takes no puts (a replica's: fetch only)")
        replica = descriptor.command.decode(errors="replace") if descriptor.command else ""
        if not replica:
            raise fl.FlightServerError("bad put: its descriptor must name the replica's data-plane address")
        table = reader.read_all()
        if not table.schema.equals(SCHEMA):
            raise fl.FlightServerError(f"bad put: not a token-payload table: schema {table.schema}")
        try:
            self.store.put_table(table, replica)
        except StagingFull as exc:
            raise fl.FlightServerError(_FULL + str(exc)) from exc
        except DataError as exc:
            raise fl.FlightServerError(f"bad put: {exc}") from exc

    def do_action(self, context, action):
        if action.type != "release":
            raise fl.FlightServerError(f"unknown action {action.type!r}")
        released = self.store.release(_ids(action.body.to_pybytes()))
        yield fl.Result(str(released).encode())

    def list_actions(self, context):
        return [("release", "forget groups by request id (JSON list); returns how many were held")]


class PayloadClient:
    """Fetches from and releases at any replica's PayloadServer; one Flight client per address."""

    def __init__(self, security: Security | None = None, timeout_s: float = 60.0):
        self.security = security or Security()
        self.timeout_s = timeout_s
        token = self.security.token
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = fl.FlightCallOptions(headers=headers, timeout=timeout_s)
        self._clients: dict[str, fl.FlightClient] = {}
        self._lock = threading.Lock()

    def _client(self, address: str) -> fl.FlightClient:
        with self._lock:
            if address not in self._clients:
                s = self.security
                scheme = "grpc+tls" if s.tls else "grpc+tcp"
                kwargs = {}
                if s.tls:
                    kwargs = {"tls_root_certs": s.ca, "override_hostname": s.server_name}
                    if s.cert and s.key:  # as the gRPC channels: the process's certificate, if any
                        kwargs.update(cert_chain=s.cert, private_key=s.key)
                self._clients[address] = fl.FlightClient(f"{scheme}://{address}",
                                                         **{k: v for k, v in kwargs.items() if v})
            return self._clients[address]

    def fetch(self, address: str, request_ids: Iterable[str]) -> dict[str, list[TokenPayload]]:
        """The payloads of `request_ids` held at `address`, by request id. PayloadMissing names
        groups it does not hold; ServiceUnavailable: the replica is gone or unreachable."""
        return from_table(self.fetch_table(address, request_ids))

    def fetch_table(self, address: str, request_ids: Iterable[str]) -> pa.Table:
        """As fetch, as the Arrow table (payload.SCHEMA): columns a learner can turn into tensors."""
        ids = list(request_ids)
        try:
            return self._client(address).do_get(fl.Ticket(json.dumps(ids).encode()), self._options).read_all()
        except fl.FlightError as exc:
            raise self._error(address, "fetch", exc) from exc

    def put(self, address: str, replica: str, groups: Mapping[str, list[TokenPayload]]) -> None:
        """Pushes `groups`, held by the replica whose data plane is at `replica`, to the staging store at
        `address` (the learner's). StagingFull: it is full; ServiceUnavailable: unreachable;
        InvalidRequest: refused (no token, a bad table)."""
        table = to_table(groups)
        descriptor = fl.FlightDescriptor.for_command(replica.encode())
        try:
            writer, _ = self._client(address).do_put(descriptor, table.schema, self._options)
            writer.write_table(table)
            writer.close()
        except fl.FlightError as exc:
            raise self._error(address, "put", exc) from exc

    def release(self, address: str, request_ids: Iterable[str]) -> int:
        body = json.dumps(list(request_ids)).encode()
        try:
            results = list(self._client(address).do_action(fl.Action("release", body), self._options))
        except fl.FlightError as exc:
            raise self._error(address, "release", exc) from exc
        return int(results[0].body.to_pybytes()) if results else 0

    @staticmethod
    def _error(address: str, what: str, exc: Exception) -> RlfleetError:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if _MISSING in text:
            return PayloadMissing(f"data plane {what} at {address}: {text.split(_MISSING, 1)[1]}")
        if _FULL in text:
            return StagingFull(f"data plane {what} at {address}: "
                               f"{text.split(_FULL, 1)[1].split('. Detail:', 1)[0]}")
        if "bad put: " in text or "takes no puts" in text:
            return InvalidRequest(f"data plane {what} at {address} refused: {text}")
        if isinstance(exc, fl.FlightUnauthenticatedError):
            return InvalidRequest(f"data plane {what} at {address} refused: {text}")
        if isinstance(exc, (fl.FlightUnavailableError, fl.FlightTimedOutError, fl.FlightCancelledError)):
            return ServiceUnavailable(f"data plane {what} at {address}: unreachable ({text})")
        return ServiceUnavailable(f"data plane {what} at {address} failed: {text}")

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
