"""The private parts of uvicorn that `jobwarden web` extends (web/server.py, web/connections.py), pinned:
pyproject allows any uvicorn < 1, and a release that renames or stops calling one of them would not
break an import, it would quietly switch a guard off (no head deadline, no connection cap, uvicorn's
400 page, a Date header, its signal handlers). Each test here names the hook and fails on its change.

What is pinned, and where jobwarden relies on it:
- `uvicorn.protocols.http.h11_impl.H11Protocol`: GuardedProtocol subclasses it and overrides
  `connection_made`, `connection_lost`, `on_response_complete` and `send_400_response`, and reads its
  `conn` (h11), `cycle` (its `response_complete`), `transport` and `loop`;
- uvicorn calls `send_400_response` inside `except h11.RemoteProtocolError` (GuardedProtocol reads the
  error from sys.exc_info) and logs "Invalid HTTP request received." (silenced by OneLineLog);
- `uvicorn.Server`: `_Uvicorn` overrides `capture_signals` (entered by `serve`), `main_loop` (awaited by
  `_serve`, which then calls `shutdown(sockets=...)`), sets `should_exit`, and sets
  `server_state.default_headers` from `config.encoded_headers` (no Date, no Server header).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import unavailable

try:
    import h11
    import uvicorn
    from uvicorn.protocols.http import h11_impl
    from uvicorn.server import ServerState

    MISSING = None
except ImportError as err:  # the web extra is not installed
    MISSING = str(err)


@pytest.fixture(autouse=True)
def _web_extra() -> None:
    if MISSING is not None:
        unavailable(f"uvicorn and h11 (the `web` extra): {MISSING}")


def _source_tree(func: Callable[..., Any]) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(func)))


def _calls(tree: ast.AST) -> set[str]:
    """The names of `self.X(...)` calls in `tree`."""
    return {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    }


def _self_assigned(cls: type) -> set[str]:
    """The attributes any method of `cls` assigns on self (`self.X = ...`, `self.X: T = ...`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    found = set()
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                found.add(target.attr)
    return found


# --- the protocol ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "parameters"),
    [
        ("connection_made", ["self", "transport"]),
        ("connection_lost", ["self", "exc"]),
        ("on_response_complete", ["self"]),
        ("send_400_response", ["self", "msg"]),
    ],
)
def test_the_protocol_methods_guarded_protocol_overrides_are_there(
    method: str, parameters: list[str]
) -> None:
    found = getattr(h11_impl.H11Protocol, method, None)
    assert found is not None, f"uvicorn's H11Protocol has no {method}: web/connections.py overrides it"
    assert list(inspect.signature(found).parameters) == parameters


def test_the_protocol_keeps_the_attributes_guarded_protocol_reads() -> None:
    assert {"conn", "cycle", "transport", "loop"} <= _self_assigned(h11_impl.H11Protocol)
    assert "response_complete" in _self_assigned(h11_impl.RequestResponseCycle)


def test_a_malformed_request_reaches_send_400_response_inside_the_except() -> None:
    """GuardedProtocol.send_400_response takes h11's error (its status hint: 431) from sys.exc_info."""
    handlers = [
        node
        for node in ast.walk(_source_tree(h11_impl.H11Protocol.handle_events))
        if isinstance(node, ast.ExceptHandler)
        and "RemoteProtocolError" in ast.unparse(node.type or ast.Pass())
    ]
    assert handlers, "uvicorn's handle_events no longer catches h11.RemoteProtocolError"
    assert any("send_400_response" in _calls(h) for h in handlers)
    assert any("Invalid HTTP request received." in ast.unparse(h) for h in handlers)  # OneLineLog's _QUIET


def test_the_response_cycle_calls_on_response_complete() -> None:
    """The head deadline restarts when an answer ends: uvicorn hands on_response_complete to the cycle."""
    tree = _source_tree(h11_impl.H11Protocol.handle_events)
    assert "self.on_response_complete" in ast.unparse(tree)


def test_the_guarded_protocol_answers_a_malformed_head_through_uvicorn() -> None:
    """End to end through uvicorn's own parsing: a real socket, a request line h11 refuses, and the
    answer is GuardedProtocol's JSON 400 (uvicorn's would be text), the connection then closed."""
    from jobwarden.web.app import Limits
    from jobwarden.web.connections import protocol_for

    async def exchange() -> bytes:
        loop = asyncio.get_running_loop()
        config = uvicorn.Config(lambda scope, receive, send: None, lifespan="off", log_config=None)
        config.load()
        protocol = protocol_for(Limits(head_timeout_s=30.0))
        state = ServerState()
        server = await loop.create_server(
            lambda: protocol(config=config, server_state=state, app_state={}, _loop=loop), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), timeout=30.0)  # to EOF: the server closes
            writer.close()
            return answer
        finally:
            server.close()

    answer = asyncio.run(exchange())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request"), answer
    assert json.loads(body)["error"].startswith("bad request: ")


# --- the server -------------------------------------------------------------------------------------


def test_serve_enters_capture_signals_and_serve_awaits_main_loop_then_shutdown() -> None:
    assert "capture_signals" in _calls(_source_tree(uvicorn.Server.serve))
    serving = _calls(_source_tree(uvicorn.Server._serve))
    assert {"main_loop", "shutdown"} <= serving, serving
    assert list(inspect.signature(uvicorn.Server.shutdown).parameters) == ["self", "sockets"]
    assert inspect.iscoroutinefunction(uvicorn.Server.main_loop)
    assert inspect.iscoroutinefunction(uvicorn.Server.shutdown)


def test_the_server_state_and_config_fields_the_server_sets_are_there() -> None:
    """_Uvicorn.main_loop sets the headers once (uvicorn's adds a Date each second) and stop() sets
    should_exit; both must still be what uvicorn reads."""
    assert "default_headers" in _self_assigned(ServerState)
    assert "should_exit" in _self_assigned(uvicorn.Server)
    assert "server_state" in _self_assigned(uvicorn.Server)
    config = uvicorn.Config(lambda scope, receive, send: None, server_header=False, date_header=False)
    config.load()
    assert config.encoded_headers == []  # no Server header: the one list main_loop hands to every answer
    # the private knobs make_server gives uvicorn.Config
    for name in (
        "h11_max_incomplete_event_size",
        "timeout_graceful_shutdown",
        "timeout_keep_alive",
        "backlog",
    ):
        assert name in inspect.signature(uvicorn.Config).parameters, name


def test_uvicorn_is_below_1() -> None:
    """pyproject's bound, which this file's pins stand behind: a 1.x is to be checked here first."""
    assert int(uvicorn.__version__.split(".")[0]) < 1
    assert tuple(int(p) for p in h11.__version__.split(".")[:2]) >= (0, 16)
