"""SHA-256 of artifacts: one definition for files and folders, used by every plane that checks one."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """SHA-256 of a file; of a folder, over each file's relative path and digest, in path order."""
    if path.is_dir():
        folder = hashlib.sha256()
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            folder.update(f"{item.relative_to(path)}\x00{sha256_file(item)}\n".encode())
        return folder.hexdigest()
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
