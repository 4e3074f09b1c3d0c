"""The platform's own functions; each folder is a function (func.yaml + handler.py)."""

from pathlib import Path

PLATFORM_FUNCTIONS = Path(__file__).parent
