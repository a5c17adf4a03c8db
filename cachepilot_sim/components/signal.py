"""A wake-up signal between processes: wait() returns an event that the next notify() triggers;
a listener, while one is set, hears the notify instead (the engine during a decode run)."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from cachepilot_sim.clock import SimEnvironment


class Signal:
    """A one-shot event renewed on every notify (the engine's wake-up)."""

    def __init__(self, env: SimEnvironment) -> None:
        self.env = env
        self._event = env.event()
        self._listener: Callable[[], None] | None = None

    def wait(self) -> simpy.Event:
        """The event the next notify() triggers."""
        return self._event

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call `listener` at each notify instead of triggering the event, until listen(None)."""
        self._listener = listener

    def notify(self) -> None:
        """Tell the listener, else wake whoever waits. A notify with neither is dropped without
        scheduling anything (waiters re-check state first, so nothing is lost)."""
        if self._listener is not None:
            self._listener()
        elif self._event.callbacks and not self._event.triggered:
            self._event.succeed()
            self._event = self.env.event()
