"""The event gateway: the outside world's signals in, validated CloudEvents on the bus out.

``create_app`` builds the FastAPI application; ``cascade gateway`` serves it with uvicorn.
"""

from cascade.events.gateway.app import create_app

__all__ = ["create_app"]
