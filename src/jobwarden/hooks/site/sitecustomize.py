"""jobwarden's Python hooks, loaded by `site` at start-up: see _jobwarden_hooks.py, which this file loads.

Kept tiny because Python compiles it at every start where it cannot cache bytecode (PYTHONDONTWRITEBYTECODE,
common in containers, or an install the job cannot write to). Compiling the hooks costs about 6 ms;
processes of a job therefore load them through a bytecode cache in the run's py dir, about 1 ms.
Runs in the job's interpreter, any CPython 3.8-3.14: standard library only, 3.8 syntax, never raises.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType

HOOKS = "_jobwarden_hooks"


def _load_hooks() -> object:
    py_dir = os.environ.get("JOBWARDEN_PY_DIR")
    if not py_dir:
        return __import__(HOOKS)  # not a job: the import system and its own bytecode cache, if any
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), HOOKS + ".py")
    module = type(sys)(HOOKS)
    module.__file__ = source
    sys.modules[HOOKS] = module
    exec(_code(source, os.path.join(py_dir, ".cache")), module.__dict__)
    return module


def _code(source: str, cache_dir: str) -> "CodeType":
    """The compiled `source` (the hooks, or a part of them) from `cache_dir`, or compiled now and cached there
    for the job's next processes."""
    import marshal  # built in

    st = os.stat(source)
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
    key = magic + f" {st.st_mtime_ns} {st.st_size}\n".encode()
    name = os.path.basename(source).rpartition(".")[0]
    cache = os.path.join(cache_dir, f"{name}.{sys.implementation.cache_tag}.code")
    try:
        with open(cache, "rb") as fh:
            data = fh.read()
        if data.startswith(key):
            return marshal.loads(data[len(key) :])  # type: ignore[no-any-return]
    except (OSError, ValueError, EOFError, TypeError):
        pass
    import __future__  # only here, once a run: the cached code does not import it at each start

    with open(source, "rb") as fh:  # the future statement as a flag (the same line numbers)
        text = fh.read().replace(b"from __future__ import annotations", b"", 1)
    # without docstrings (optimize=2): 17 % less code to unmarshal at every start (the hooks assert nothing)
    flags = __future__.annotations.compiler_flag
    code: CodeType = compile(text, source, "exec", flags, dont_inherit=True, optimize=2)
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        tmp = f"{cache}.{os.getpid()}.tmp"  # processes of a job start together: one file each
        with open(tmp, "wb") as fh:
            fh.write(key + marshal.dumps(code))
        os.replace(tmp, cache)
        _cache_own_bytecode()
    except (OSError, AttributeError, ValueError):
        pass
    return code


def _cache_own_bytecode() -> None:
    """Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE), it compiles this file at every start of
    every process, 0.5-1.6 ms measured: the first process of a run writes it as the import system would,
    where jobwarden's folder is writable (an install by pip has it already)."""
    cached = globals().get("__cached__")
    external = sys.modules.get("_frozen_importlib_external")
    if not cached or not hasattr(external, "_code_to_timestamp_pyc"):
        return
    st = os.stat(__file__)
    stamped = external._code_to_timestamp_pyc  # type: ignore[union-attr]
    header = stamped(compile("", "", "exec"), int(st.st_mtime), st.st_size)[:16]  # magic, flags, mtime, size
    try:
        with open(cached, "rb") as fh:
            if fh.read(16) == header:
                return  # up to date (a stale one, from before an edit, is compiled at every start)
    except OSError:
        pass
    with open(__file__, "rb") as fh:
        code = compile(fh.read(), __file__, "exec", dont_inherit=True)
    data = stamped(code, int(st.st_mtime), st.st_size)
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    tmp = f"{cached}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, cached)


def _main() -> None:
    try:
        hooks = sys.modules.get(HOOKS) or _load_hooks()
        hooks.main(__file__, _code)  # type: ignore[attr-defined]
    except Exception as err:
        sys.modules.pop(HOOKS, None)
        sys.stderr.write(f"jobwarden: python hooks not loaded: {err}\n")


if __name__ == "sitecustomize":
    _main()
