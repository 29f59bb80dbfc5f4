"""One error hierarchy for rlfleet.

Each error names the gRPC status code it maps to (as the code's *name*, so this
module never imports grpc) and also inherits the stdlib exception a Python caller
would expect, so cores stay usable without the RPC layer.
"""
from __future__ import annotations


class RlfleetError(Exception):
    """Base of every error rlfleet raises on purpose."""

    grpc_code: str = "INTERNAL"


class ConfigError(RlfleetError, ValueError):
    """A config key or value is wrong; the message names the key."""

    grpc_code = "INVALID_ARGUMENT"


class InvalidRequest(RlfleetError, ValueError):
    """A request is malformed or inconsistent."""

    grpc_code = "INVALID_ARGUMENT"


class RequestTooLarge(RlfleetError, ValueError):
    """A request exceeds a configured size limit."""

    grpc_code = "RESOURCE_EXHAUSTED"


class Busy(RlfleetError, RuntimeError):
    """The service is already doing this (a weight join, pull or push) and refuses a second one
    instead of queueing it on a server thread."""

    grpc_code = "RESOURCE_EXHAUSTED"


class DataError(RlfleetError, ValueError):
    """A data file is missing, corrupt, or lacks a column."""

    grpc_code = "FAILED_PRECONDITION"


class NotReady(RlfleetError, RuntimeError):
    """The service has not loaded its model yet, or is shutting down."""

    grpc_code = "UNAVAILABLE"


class ServiceUnavailable(RlfleetError, ConnectionError):
    """A peer service cannot be reached."""

    grpc_code = "UNAVAILABLE"


class PeerSilent(ServiceUnavailable):
    """A peer stopped answering while a call was open: its connection's keepalive pings went unanswered
    (a frozen process, a partitioned host), as opposed to a connection that broke."""


class WeightSyncError(RlfleetError, RuntimeError):
    """A weight transfer failed, timed out or was aborted."""

    grpc_code = "ABORTED"


class VersionMismatch(RlfleetError, RuntimeError):
    """Two sides disagree about the policy version."""

    grpc_code = "FAILED_PRECONDITION"


class RewardError(RlfleetError, RuntimeError):
    """A reward function failed or returned something that is not a finite number."""

    grpc_code = "INTERNAL"


class CheckpointError(RlfleetError, RuntimeError):
    """A checkpoint is missing or corrupt."""

    grpc_code = "FAILED_PRECONDITION"


class FleetRefused(RlfleetError, PermissionError):
    """A rollout replica may not join the run's fleet (a different model), or the address is no member."""

    grpc_code = "FAILED_PRECONDITION"
