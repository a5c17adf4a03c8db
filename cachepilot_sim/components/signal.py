"""A wake-up signal between processes: wait() returns an event that the next notify() triggers."""

from __future__ import annotations

import simpy

from cachepilot_sim.clock import SimEnvironment


class Signal:
    """A one-shot event renewed on every notify (the engine's wake-up)."""

    def __init__(self, env: SimEnvironment) -> None:
        self.env = env
        self._event = env.event()

    def wait(self) -> simpy.Event:
        """The event the next notify() triggers."""
        return self._event

    def notify(self) -> None:
        """Wake whoever waits; a notify with no waiter is dropped (waiters re-check state first)."""
        if not self._event.triggered:
            self._event.succeed()
            self._event = self.env.event()
