"""Core shared by all planes: the error tree, settings and the state store.

Nothing here imports ``events``, ``serving`` or ``functions`` (checked by import-linter).
"""
