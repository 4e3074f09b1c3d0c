"""Model artifacts, fetched once and kept by checksum, so a cold start does not download again.

``fetch(uri, sha256, cache, policy)`` returns a local file whose SHA-256 was verified:
``file://`` paths are copied (a folder, such as a Hugging Face model or a LoRA adapter, is
copied whole and checked with the folder digest of ``cascade.core.hashing``), ``http(s)://``
downloads resume from a partial file with a Range request. Where from is the :class:`ArtifactPolicy`'s call: files only under the artifact roots
(job outputs), downloads only from allowlisted hosts, and a redirect only to another of them.
The cache is private to the platform (folders 0700, files 0600). A checksum mismatch deletes
the file and raises without saying what the bytes hashed to, so a corrupted or substituted
artifact is never served and the error reveals nothing about a file the caller could not read.
"""

from __future__ import annotations

import os
import shutil
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import httpx

from cascade.core.errors import InvalidInput, RetryableError
from cascade.core.hashing import sha256_file
from cascade.core.settings import Settings

MAX_REDIRECTS = 5


class ChecksumMismatch(InvalidInput):
    """The artifact's bytes do not hash to the release's sha256."""


class ArtifactRefused(InvalidInput):
    """An artifact URI outside the roots and hosts the platform fetches from."""


@dataclass(frozen=True)
class ArtifactPolicy:
    roots: tuple[Path, ...]
    hosts: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, cfg: Settings) -> ArtifactPolicy:
        return cls((cfg.artifact_root, *(p.resolve() for p in cfg.security.artifact_roots)),
                   tuple(h.lower() for h in cfg.security.artifact_hosts))

    def local(self, uri: str) -> Path:
        """The real path of a ``file://`` URI inside a root (symlinks resolved), else ArtifactRefused."""
        path = Path(unquote(urlparse(uri).path)).resolve()
        if not any(path.is_relative_to(root.resolve()) for root in self.roots):
            raise ArtifactRefused(f"artifact {uri} is outside the artifact roots this platform serves from",
                                  field="artifactUri")
        return path

    def check_url(self, url: str) -> None:
        if (urlparse(url).hostname or "").lower() not in self.hosts:
            raise ArtifactRefused(f"artifact host of {url} is not in security.artifact_hosts", field="artifactUri")


def _download(url: str, target: Path, policy: ArtifactPolicy, *, headers: Mapping[str, str] | None = None,
              verify: ssl.SSLContext | bool = True, rate: float = 0.0) -> int:
    """Download ``url`` to ``target``, resuming a ``.part`` file with a Range request; at most ``rate`` bytes a
    second when given. ``headers`` (a credential) go only to ``url``'s own host. The bytes received."""
    partial = target.with_suffix(target.suffix + ".part")
    start = partial.stat().st_size if partial.exists() else 0
    first_host, received, began = urlparse(url).hostname, 0, time.monotonic()
    try:
        with httpx.Client(timeout=60, follow_redirects=False, verify=verify) as client:
            for _ in range(MAX_REDIRECTS + 1):
                policy.check_url(url)
                asked = {**((headers or {}) if urlparse(url).hostname == first_host else {}),
                         **({"range": f"bytes={start}-"} if start else {})}
                with client.stream("GET", url, headers=asked) as response:
                    if response.is_redirect:
                        url = urljoin(url, response.headers.get("location", ""))
                        continue
                    if response.status_code == 416:
                        partial.replace(target)
                        return received
                    if response.status_code >= 400:
                        raise RetryableError(f"download {url}: HTTP {response.status_code}")
                    append = bool(start) and response.status_code == 206
                    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o600)
                    with os.fdopen(fd, "wb") as f:
                        for chunk in response.iter_bytes(min(1 << 20, max(1 << 12, int(rate / 8))) if rate else 1 << 20):
                            f.write(chunk)
                            received += len(chunk)
                            ahead = received / rate - (time.monotonic() - began) if rate else 0.0
                            if ahead > 0:  # the bandwidth limit: wait until the budget has caught up
                                time.sleep(ahead)
                    break
            else:
                raise ArtifactRefused(f"download {url}: more than {MAX_REDIRECTS} redirects", field="artifactUri")
    except httpx.HTTPError as exc:
        raise RetryableError(f"download {url}: {exc}") from exc
    partial.replace(target)
    return received


def _copy_private(source: Path, target: Path) -> None:
    """Copy a file (0600) or a folder (0700, its files 0600); links inside a folder are not followed."""
    if source.is_dir():
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(mode=0o700)
        for item in sorted(source.rglob("*")):
            if item.is_symlink():
                raise InvalidInput(f"artifact folder {source} holds a link ({item.name}); it is not copied",
                                   field="artifactUri")
            dest = target / item.relative_to(source)
            if item.is_dir():
                dest.mkdir(mode=0o700)
            else:
                _copy_private(item, dest)
        return
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with source.open("rb") as src, os.fdopen(fd, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def _discard(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def check_base(artifact: Path, fmt: str, policy: ArtifactPolicy) -> None:
    """A LoRA adapter loads its base model from the path its ``adapter_config.json`` names: that path is an
    artifact too, so it must lie under the artifact roots (a hub name is refused: nothing is downloaded)."""
    if fmt != "lora-adapter":
        return
    try:
        import json

        base = str(json.loads((artifact / "adapter_config.json").read_text())["base_model_name_or_path"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"the adapter has no readable adapter_config.json naming its base model: {exc}",
                           field="artifactUri") from exc
    if not Path(base).is_absolute():
        raise ArtifactRefused(f"the adapter's base model {base!r} is not a local folder; models are not downloaded "
                              "from a hub here", field="artifactUri")
    try:
        policy.local(Path(base).as_uri())
    except ArtifactRefused as exc:
        raise ArtifactRefused(f"the adapter's base model {base} is outside the artifact roots this platform "
                              "serves from", field="artifactUri") from exc


def fetch(uri: str, sha256: str, cache: Path, policy: ArtifactPolicy) -> Path:
    """The verified local copy of ``uri``; downloads only when the cache lacks it."""
    return download(uri, sha256, cache, policy)[0]


def download(uri: str, sha256: str, cache: Path, policy: ArtifactPolicy, *, name: str = "",
             headers: Mapping[str, str] | None = None, verify: ssl.SSLContext | bool = True,
             rate: float = 0.0) -> tuple[Path, int]:
    """``fetch`` with the knobs of a thin link: the file's ``name`` in the cache (default: the URI's), a
    credential for the artifact's host, the CA to trust, a bandwidth limit (bytes/s); also the bytes
    transferred (0 when the cache had it)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        source = policy.local(uri)
    elif parsed.scheme in ("http", "https"):
        policy.check_url(uri)
    else:
        raise InvalidInput(f"artifact scheme {parsed.scheme!r} is not supported (file, http, https)", field="artifactUri")
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise InvalidInput("sha256 must be 64 lowercase hex digits", field="sha256")
    name = name or Path(unquote(parsed.path)).name or "artifact"
    folder = cache / sha256
    target = folder / name
    if target.exists() and sha256_file(target) == sha256:
        return target, 0
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.mkdir(exist_ok=True, mode=0o700)
    if parsed.scheme in ("", "file"):
        if source.is_symlink() or not (source.is_file() or source.is_dir()):
            raise InvalidInput(f"artifact {uri} is not a file or a folder", field="artifactUri")
        _copy_private(source, target)
        received = 0
    else:
        received = _download(uri, target, policy, headers=headers, verify=verify, rate=rate)
    if sha256_file(target) != sha256:
        _discard(target)
        raise ChecksumMismatch(f"artifact {uri} does not match the release's sha256", field="sha256")
    return target, received
