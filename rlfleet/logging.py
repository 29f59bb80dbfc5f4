"""structlog setup: JSON lines to a file per service, readable lines on the console.

Every line carries `service` and `run`, whatever thread logs it; fields set with
`set_log_fields` (the served policy version of a service, say) are added to
every line too, and callables among them are read at the moment of logging.
Per-request fields (`request_id`, the controller's `step`) are bound with
structlog's contextvars by the RPC layer and the training loop.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_PROCESS_FIELDS: dict[str, Any] = {}  # logging is process-wide state; so are these


def set_log_fields(**fields: Any) -> None:
    """Adds fields to every log line of this process; a callable value is called per line."""
    _PROCESS_FIELDS.update(fields)


def _add_process_fields(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    for key, value in _PROCESS_FIELDS.items():
        if key in event:
            continue
        if callable(value):
            try:
                value = value()
            except Exception:  # noqa: BLE001, S112 - a log line must never fail for its context
                continue
        if value is not None:
            event[key] = value
    return event


def setup_logging(service: str, level: str = "info", log_file: Path | None = None,
                  console: bool = True, run: str | None = None) -> structlog.stdlib.BoundLogger:
    """Routes structlog through stdlib logging so grpc/torch warnings land in the same files."""
    _PROCESS_FIELDS.clear()
    set_log_fields(service=service, run=run)
    shared = [
        structlog.contextvars.merge_contextvars,
        _add_process_fields,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(_LEVELS[level])
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
        handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
            foreign_pre_chain=shared))
        root.addHandler(handler)
    if console:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())],
            foreign_pre_chain=shared))
        handler.setLevel(max(_LEVELS[level], logging.WARNING) if log_file else _LEVELS[level])
        root.addHandler(handler)
    return structlog.get_logger(service)


def setup_command_logging(command: str) -> None:
    """A command that computes in its own process (`rlfleet sft`, `eval`, `data traces`, …) prints its own
    lines; what it runs in-process (an environment server and its client, the learner, transformers)
    writes only warnings and errors, to stderr: not a debug line per RPC nor a progress bar per model load."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is imported
    setup_logging(command, "warning", None)
