"""A new broker process's first seconds: requests from the previous process's gateways wait.

A broker started again (a planned restart, or after a crash) loads the repository and takes
over the instances its worker hosts still run (broker/adoption.py); its versions are LOADING
until those instances say HELLO again, which takes a few heartbeats. Its gateways lived through
the restart: they keep sending requests with the model table of the previous process, and
models keep making BLS calls. Rather than answer those requests "not ready" for the length of
the takeover, the broker queues them
(the scheduler asks ``holds``) and keeps its own table, with its loading versions, from those
gateways (``defer``) so that they do not answer "not ready" themselves. The hold ends when the
startup load has ended (every version READY or failed) or, at the latest, after ``hold_s``;
then what is still queued for a loading version is answered "not ready", and the deferred
gateways get the table.

A gateway started with the broker says HELLO and gets the table at once: it has no older table
to serve with, and Triton does not serve before its startup load has ended either.

The worker hosts register in these seconds too, each listing the instances it still runs.
Until they have (``awaits_hosts``), the autoscaler places nothing: it would start instances
that a host about to register still runs. During a takeover (a host lists a kept instance, or a
previous process's gateway heartbeats) the other hosts are awaited for ``rejoin_s`` after the
first: each registers at its next heartbeat once its socket reconnected.
"""

from __future__ import annotations

from collections.abc import Callable


class StartupHold:
    """Whether requests for loading versions wait, and the gateways whose table waits with them."""

    def __init__(self, hold_s: float, clock_ns: Callable[[], int], rejoin_s: float = 0.0) -> None:
        self._clock_ns = clock_ns
        self.until_ns = clock_ns() + int(hold_s * 1e9)
        self.open = hold_s > 0
        self._deferred: set[bytes] = set()   # gateways of a previous broker process, table not sent yet
        self._rejoin_ns = int(rejoin_s * 1e9)
        self._first_host_ns: int | None = None
        self._takeover = False   # a previous broker process's peers showed up

    def holds(self, now_ns: int) -> bool:
        """Whether a request for a loading version waits for it, now."""
        return self.open and now_ns < self.until_ns

    def host_registered(self, kept_instances: bool) -> None:
        if kept_instances:
            self._takeover = True
        if self._first_host_ns is None:
            self._first_host_ns = self._clock_ns()

    def awaits_hosts(self, now_ns: int) -> bool:
        """Whether worker hosts that have not registered are still expected. Counted on the hold's
        time, not on ``open``: a startup load whose versions need no instance (autoscaled ones at
        zero) ends the hold at once."""
        if now_ns >= self.until_ns:
            return False
        if self._first_host_ns is None:
            return True
        return self._takeover and now_ns < self._first_host_ns + self._rejoin_ns

    def defer(self, gateway: bytes) -> bool:
        """A gateway of the previous process registered by heartbeating: whether its table waits."""
        self._takeover = True
        if self.open:
            self._deferred.add(gateway)
        return self.open

    def deferred(self, gateway: bytes) -> bool:
        return gateway in self._deferred

    def undefer(self, gateway: bytes) -> bool:
        """The gateway makes a control call (a load, a shared memory region): it gets the table
        from now on, loading versions and all, since its client must find what the call did.
        Whether its table was waiting."""
        if gateway in self._deferred:
            self._deferred.discard(gateway)
            return True
        return False

    def close_if_over(self, loading: bool) -> set[bytes] | None:
        """End the hold once nothing loads or its time is up: the gateways whose table waited
        (None while it lasts, or when it ended before)."""
        if not self.open or (loading and self._clock_ns() < self.until_ns):
            return None
        self.open = False
        deferred, self._deferred = self._deferred, set()
        return deferred
