"""structlog setup: JSON lines to a file per service, readable lines on the console."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging(service: str, level: str = "info", log_file: Path | None = None,
                  console: bool = True) -> structlog.stdlib.BoundLogger:
    """Routes structlog through stdlib logging so grpc/torch warnings land in the same files."""
    shared = [
        structlog.contextvars.merge_contextvars,
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
    structlog.contextvars.bind_contextvars(service=service)
    return structlog.get_logger(service)
