"""`jobwarden web`: the dashboard and JSON API; uvicorn and asyncio load in its handler alone."""

from __future__ import annotations

import argparse

HELP = "serve a dashboard and a JSON API of the jobs (127.0.0.1, with a token)"


def add_arguments(web: argparse.ArgumentParser) -> None:
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    web.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free port)")
    web.add_argument("--socket", metavar="PATH", help="listen on this Unix socket (0600) instead")
    web.add_argument("--read-only", action="store_true", help="no stop or dump buttons, no POST at all")
    web.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="H",
        help="also answer requests for this Host name (e.g. behind a proxy); repeatable",
    )


def handle(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jobwarden.paths import home_dir
    from jobwarden.web.command import web  # uvicorn and asyncio: only for this command

    socket_path = Path(args.socket).absolute() if args.socket else None
    return web(home_dir(), args.host, args.port, socket_path, args.read_only, args.allow_host)
