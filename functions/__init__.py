"""Functions: the SDK for event handlers and the platform's own functions and launchers.

Builds on ``serving``, ``events`` and ``cascade.core``; only the CLI imports it.
"""
