"""The event plane: CloudEvents contract, buses, gateway, sources, triggers and dispatcher.

Depends only on ``cascade.core``; serving and functions build on it.
"""
