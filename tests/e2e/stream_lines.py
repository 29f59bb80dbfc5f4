"""What a running process has written to a pipe so far, for tests that wait on a line of it.

`communicate()` reads a pipe only once the process ends; a test that must act when a line appears
(an outage noticed) reads it from a thread instead, and still gets the whole text at the end."""
from __future__ import annotations

import threading
import time
from typing import IO


class StreamLines:
    def __init__(self, stream: IO[str]):
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self._lines.append(line)

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def wait_for(self, needle: str, timeout_s: float, alive=lambda: True) -> None:
        """Until `needle` has been written; fails after `timeout_s` or once `alive()` is false."""
        deadline = time.monotonic() + timeout_s
        while needle not in self.text:
            assert alive(), f"the process ended before writing {needle!r}:\n{self.text[-3000:]}"
            assert time.monotonic() < deadline, f"no {needle!r} within {timeout_s:g}s:\n{self.text[-3000:]}"
            time.sleep(0.1)

    def rest(self, timeout_s: float = 60) -> str:
        """The whole text, once the stream has ended (the process exited)."""
        self._reader.join(timeout_s)
        return self.text
