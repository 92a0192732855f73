"""The session's channel to a process it spawns (a replacement process), where that process cannot
inherit a socket (``platforms``: Windows' ``subprocess`` passes no descriptors): the session
listens on the loopback interface, the process connects back and names itself with a token only
the session and it know; any other connection is refused."""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable

LOOPBACK = "127.0.0.1"
TOKEN_BYTES = 16
_ACCEPT_POLL_S = 0.2


class ChannelError(OSError):
    """The process never connected back (it ended, or the time ran out)."""


class ChannelListener:
    """The session's side: a listening socket on the loopback interface and the token to expect."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(TOKEN_BYTES)
        self._socket = socket.create_server((LOOPBACK, 0))
        self.port: int = self._socket.getsockname()[1]

    def accept(self, still_starting: Callable[[], bool], timeout_s: float) -> socket.socket:
        """The connection of the process that names the token; ``ChannelError`` once
        ``still_starting()`` is false (the process ended) or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        self._socket.settimeout(_ACCEPT_POLL_S)
        try:
            while time.monotonic() < deadline:
                try:
                    connection, _ = self._socket.accept()
                except TimeoutError:
                    if not still_starting():
                        raise ChannelError("the process ended before it connected back") from None
                    continue
                connection.settimeout(timeout_s)
                if connection.recv(len(self.token)).decode(errors="replace") == self.token:
                    connection.settimeout(None)
                    return connection
                connection.close()  # not ours
            raise ChannelError(f"the process did not connect back within {timeout_s:g} s")
        finally:
            self._socket.close()


def connect_back(port: int, token: str) -> socket.socket:
    """The spawned process's side: connect to the session and name the token."""
    connection = socket.create_connection((LOOPBACK, port))
    connection.sendall(token.encode())
    return connection
