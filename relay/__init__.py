"""The stateless relay: the well-known bind point every component connects to.

Read in order: :mod:`relay.validation` (what a history request must satisfy),
:mod:`relay.metrics` (what is counted), :mod:`relay.server` (the sockets and loops).
"""

from relay.server import Relay

__all__ = ["Relay"]
