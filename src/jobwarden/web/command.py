"""`jobwarden web`'s entry: check that the web extra is installed, then serve.

Imported by the CLI's `web` handler only, so no other command loads uvicorn or asyncio."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from jobwarden.errors import JobwardenError


def web_importable() -> bool:
    try:
        import h11  # noqa: F401 - a broken install fails here, not in the middle of a request
        import uvicorn  # noqa: F401
    except ImportError:
        return False
    return True


def web(
    home: Path,
    host: str,
    port: int,
    socket_path: Path | None,
    read_only: bool,
    allow_hosts: Sequence[str],
) -> int:
    if not web_importable():
        from jobwarden.paths import install_extra_command

        raise JobwardenError(
            "jobwarden web needs uvicorn and h11, which are not installed", install_extra_command("web")
        )
    from jobwarden.web.server import serve

    return serve(home, host, port, socket_path, read_only, allow_hosts)
