"""The waiting queue: requests submitted from the server's threads, held until the scheduler's thread admits them,
under one lock (the scheduler waits on it when it has nothing to do)."""
from __future__ import annotations

import threading
from collections import deque

from .request import QueueFull, Request


class WaitingQueue:
    """Requests waiting for a row, oldest first; ``capacity`` is max_batch + max_queue, counted with the ``active``
    requests the caller reports."""

    def __init__(self, max_batch: int, max_queue: int) -> None:
        self.max_batch, self.max_queue = max_batch, max_queue
        self.requests: deque[Request] = deque()
        self.lock = threading.Condition()
        self.closing = False

    def __len__(self) -> int:
        return len(self.requests)

    def put(self, request: Request, active: int) -> None:
        """Queue ``request`` (``active`` requests already admitted): QueueFull past max_batch + max_queue."""
        with self.lock:
            if self.closing:
                raise RuntimeError("the scheduler is stopped")
            if len(self.requests) + active >= self.max_batch + self.max_queue:
                raise QueueFull(f"{active} requests are running and {len(self.requests)} waiting "
                                f"(--max-batch {self.max_batch}, --max-queue {self.max_queue})")
            self.requests.append(request)
            self.lock.notify()

    def first(self) -> Request | None:
        """The oldest request not cancelled (the cancelled ones before it are dropped), or None."""
        with self.lock:
            while self.requests and self.requests[0].cancelled:
                self.requests.popleft()
            return self.requests[0] if self.requests else None

    def pop(self) -> Request:
        """The oldest request leaves the queue (admitted)."""
        with self.lock:
            return self.requests.popleft()

    def put_first(self, request: Request) -> None:
        """``request`` waits again, ahead of the others (preempted: recomputed first)."""
        with self.lock:
            self.requests.appendleft(request)

    def wait(self, busy) -> bool:
        """Block until a request waits, ``busy()`` is true, or ``close``; False once closing."""
        with self.lock:
            while not (self.closing or self.requests or busy()):
                self.lock.wait()
            return not self.closing

    def close(self) -> None:
        """No more requests; the waiting thread wakes."""
        with self.lock:
            self.closing = True
            self.lock.notify()

    def drain(self) -> list[Request]:
        """The requests still queued, now removed."""
        with self.lock:
            left = list(self.requests)
            self.requests.clear()
            return left
