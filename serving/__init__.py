"""The serving plane: scale-to-zero runtime, KServe deployments, inference gateway, edge agent.

Builds on ``events`` and ``cascade.core``; never imports ``functions`` or the CLI.
"""
