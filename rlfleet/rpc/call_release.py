"""Letting go of a failed gRPC stream at once, not at the interpreter's final garbage collection."""
from __future__ import annotations


def release_call(err: BaseException) -> None:
    """Breaks the reference cycle a caught stream error leaves. The error a gRPC stream raises is its own
    call object, and its traceback holds frames (grpc's `__next__`, the caller's loop) that refer back
    to it, so only a garbage collection frees it. When that is the final collection at exit, grpc's
    call finaliser can wait for ever for a lock that a daemon thread, stopped mid-call by the exit,
    still holds (issue 32: `rlfleet reward check` printed its table and never exited). Call it in the
    `except` block, once the error's code and details have been read."""
    err.__traceback__ = None
