"""What every command module shares: the ``cascade`` app, settings, errors, tables, JSON input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from cascade.core.settings import Settings

app = typer.Typer(help="Cascade: event-driven, serverless ML.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def console() -> Any:
    """A rich console; when output is piped, wide enough that tables are not cut."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 240, highlight=False)


BusOption = Annotated[Optional[str], typer.Option(
    help="kafka://HOST:PORT or embedded:///PATH (default: the configured bus, else the embedded SQLite log).")]
StateOption = Annotated[Optional[str], typer.Option(
    help="redis://HOST:PORT/DB or sqlite:///PATH (default: the configured store, else SQLite).")]
TriggersOption = Annotated[Optional[list[Path]], typer.Option("--triggers", help="Trigger files or folders.")]


def settings(*, bus: str | None = None, state: str | None = None) -> Settings:
    """The settings, with a command's --bus and --state (when given) over the configured ones."""
    from cascade.core.settings import Settings

    try:
        cfg = Settings()
    except Exception as exc:  # pydantic's message names the bad variable
        fail(f"bad configuration: {exc}")
        raise
    cfg.bus.url = bus or cfg.bus.url
    cfg.state.url = state or cfg.state.url
    return cfg


def load_data(data: str) -> Any:
    text = Path(data[1:]).read_text() if data.startswith("@") else data
    try:
        return json.loads(text)
    except ValueError as exc:
        fail(f"--data is not JSON ({exc}); pass a JSON object or @file.json")


def gateway_call(method: str, path: str, token: str | None, **kwargs: Any) -> Any:
    """Call the running gateway with ``token`` (default: the saved one); exits with its message on an error."""
    import httpx

    from cascade.app import wiring

    cfg = settings()
    token = token or wiring.saved_token(cfg)
    if not token:
        fail("no token: pass --token, set CASCADE_TOKEN, or run `cascade up` once to create one")
    url = f"{cfg.gateway_url}{path}"
    try:
        reply = httpx.request(method, url, headers={"authorization": f"Bearer {token}"}, timeout=60,
                              verify=cfg.gateway_verify, **kwargs)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the gateway at {url} ({exc}); is `cascade up` running?")
        raise
    if reply.status_code >= 400:
        fail(f"{reply.status_code}: {reply.text}")
    return reply.json()
