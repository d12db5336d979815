"""uvicorn around the application: in the foreground (the command), or in a background thread (tests, benchmarks,
a notebook) on a port the system chooses."""
from __future__ import annotations

import signal
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def serve_forever(app, host: str = "127.0.0.1", port: int = 8000, *, scheduler=None, log_level: str = "info") -> None:
    """Serve ``app`` until Ctrl-C (or ``scheduler.stop()``). With ``scheduler`` (the app's), its steps run in this
    thread, the HTTP server in another: the thread that loaded the model owns the OpenMP threads the steps use,
    where a second thread's team beside it makes every step slower (docs/serving.md)."""
    import uvicorn

    if scheduler is None:
        uvicorn.run(app, host=host, port=port, log_level=log_level)
        return
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
    http = threading.Thread(target=server.run, name="qkv-serve-http", daemon=True)
    scheduler.claim()  # before the app's lifespan asks
    http.start()
    while not server.started:
        if not http.is_alive():  # uvicorn said why (a port in use): exit as it would
            raise SystemExit(1)
        time.sleep(0.01)
    with interrupted_by(signal.SIGINT, signal.SIGTERM):
        try:
            scheduler.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.should_exit = True
            http.join()


@contextmanager
def interrupted_by(*signals: int) -> Iterator[None]:
    """Inside, in the main thread: each of ``signals`` raises KeyboardInterrupt (uvicorn, in another thread, sets no
    handlers; a shell's background job starts with SIGINT ignored); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, signal.default_int_handler) for s in signals}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextmanager
def running(app, host: str = "127.0.0.1", port: int = 0, *, timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` from a background thread for the block; yields its base URL (``http://HOST:PORT``).
    ``port`` 0: a free one."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="qkv-serve-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{sock.getsockname()[1]}")
        time.sleep(0.01)
    try:
        yield f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
