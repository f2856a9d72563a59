"""A TCP proxy that can cut the network without closing anything (a partition).

    with TcpProxy(server.port) as proxy:
        rs = Rsched.from_url(proxy.url, namespace)   # the holder's traffic goes through it
        ...
        proxy.cut()      # stop forwarding both ways; connections stay open, bytes pile up
        proxy.restore()  # forward again (what was held back is delivered)

While cut, new connections are accepted (the listening socket is the
proxy's) but nothing reaches the server, as behind a dead link: a client
sees no reset and no error, only silence, until its own timeout.
:attr:`last_to_server` is the monotonic time (this process's clock, the one
the tests compare with) just before the last bytes were handed to the server:
nothing the client sent after it can have reached the server before the cut.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class TcpProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self._listen = socket.socket()
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listen.bind(("127.0.0.1", 0))
        self._listen.listen(64)
        self.port = int(self._listen.getsockname()[1])
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.last_to_server = 0.0
        self.cut_at: float | None = None
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut(self) -> float:
        """Stop forwarding (both ways); returns the monotonic time of the cut."""
        with self._lock:
            self._forwarding.clear()
            self.cut_at = time.monotonic()
            return self.cut_at

    def restore(self) -> None:
        self._forwarding.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listen.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while True:  # hold the bytes while the link is cut
                    self._forwarding.wait()
                    with self._lock:
                        if not self._forwarding.is_set():
                            continue
                        if to_server:
                            self.last_to_server = time.monotonic()
                        break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._forwarding.set()
        try:
            self._listen.close()
        except OSError:
            pass
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
