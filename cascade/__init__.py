"""Cascade: an event-driven, serverless ML platform.

This package holds the core shared by every plane (``cascade.core``: errors, settings,
state stores, accelerators) and the command line that wires the planes together
(``cascade.cli``). Layers point one way: cli -> functions -> serving -> events -> core.
"""

__version__ = "0.1.0"
