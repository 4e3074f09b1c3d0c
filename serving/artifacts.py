"""Model artifacts, fetched once and kept by checksum, so a cold start does not download again.

``fetch(uri, sha256, cache)`` returns a local file whose SHA-256 was verified: ``file://``
paths are copied, ``http(s)://`` downloads resume from a partial file with a Range request.
A checksum mismatch deletes the file and raises, so a corrupted artifact is never served.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx

from cascade.core.errors import InvalidInput, RetryableError
from cascade.core.hashing import sha256_file


class ChecksumMismatch(InvalidInput):
    """The artifact's bytes do not hash to the release's sha256."""


def _download(url: str, target: Path) -> None:
    partial = target.with_suffix(target.suffix + ".part")
    start = partial.stat().st_size if partial.exists() else 0
    headers = {"range": f"bytes={start}-"} if start else {}
    try:
        with httpx.stream("GET", url, headers=headers, timeout=60, follow_redirects=True) as response:
            if response.status_code == 416:
                partial.replace(target)
                return
            if response.status_code >= 400:
                raise RetryableError(f"download {url}: HTTP {response.status_code}")
            mode = "ab" if start and response.status_code == 206 else "wb"
            with partial.open(mode) as f:
                for chunk in response.iter_bytes(1 << 20):
                    f.write(chunk)
    except httpx.HTTPError as exc:
        raise RetryableError(f"download {url}: {exc}") from exc
    partial.replace(target)


def fetch(uri: str, sha256: str, cache: Path) -> Path:
    """The verified local copy of ``uri``; downloads only when the cache lacks it."""
    parsed = urlparse(uri)
    name = Path(unquote(parsed.path)).name or "artifact"
    folder = cache / sha256
    target = folder / name
    if target.exists() and sha256_file(target) == sha256:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    if parsed.scheme in ("", "file"):
        source = Path(unquote(parsed.path))
        if not source.exists():
            raise InvalidInput(f"artifact {uri} does not exist", field="artifactUri")
        shutil.copyfile(source, target)
    elif parsed.scheme in ("http", "https"):
        _download(uri, target)
    else:
        raise InvalidInput(f"artifact scheme {parsed.scheme!r} is not supported (file, http, https)", field="artifactUri")
    actual = sha256_file(target)
    if actual != sha256:
        target.unlink()
        raise ChecksumMismatch(f"artifact {uri} has sha256 {actual}, the release says {sha256}", field="sha256")
    return target
