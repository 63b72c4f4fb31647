"""What a run is started with, read from outside the job (observations.Fingerprint): the interpreter its
command runs, the packages installed where that interpreter imports from, the git state of its directory,
its GPUs and the host. The shim gathers it after the job has started (shim.record.fingerprint); this
module says what to run and how to read the answers.

Two short helpers do the reading that needs another program, each in a session of its own with a deadline:

- GIT_SCRIPT (/bin/sh): the commit, the branch, whether tracked files differ from HEAD and, if so, `git diff
  HEAD` hashed by git itself (the diff is never stored). `--no-optional-locks`: a status never takes the
  index lock from the user's own git.
- PY_SNIPPET, in the job's own interpreter with `-S -B`: its version and every directory it imports from,
  as site.py would add them, *without* site.py: no .pth file or sitecustomize of the job's runs (one that
  starts coverage or prints would act in our helper), no bytecode is written.

The package list is then read here from those directories' `*.dist-info` / `*.egg-info` names: no
importlib.metadata (which opens every METADATA file). Measured on a venv of 113 distributions: 0.3 ms
here against 90 ms of CPU for `importlib.metadata.distributions()` in the interpreter (docs/measurements.md).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence

from jobwarden.observations import GitState, GpuDevice
from jobwarden.osapi.process import which

# The version, then the directories the interpreter imports from, in site.py's order: sys.path as
# startup built it (PYTHONPATH, the standard library), then, as site.main() would add them, the user's
# site-packages and the prefixes' site-packages (a venv's own, and its base's with
# include-system-site-packages). Any Python 3; `-S` leaves site.py's functions importable but unrun.
PY_SNIPPET = """\
import json, os, site, sys
exe = os.path.dirname(os.path.abspath(sys.executable))
prefixes, user, venv = [sys.prefix, sys.exec_prefix], site.check_enableusersite(), None
for cfg in (os.path.join(exe, "pyvenv.cfg"), os.path.join(os.path.dirname(exe), "pyvenv.cfg")):
    if os.path.isfile(cfg):
        venv = os.path.dirname(exe)
        with open(cfg) as fh:
            keys = dict(l.split("=", 1) for l in fh if "=" in l)
        system = {k.strip().lower(): v.strip().lower() for k, v in keys.items()}.get(
            "include-system-site-packages") == "true"
        prefixes = [venv] + (prefixes if system else [])
        user = user and system
        break
paths = [p for p in sys.path if p]  # not "" (the directory -c runs in)
if user:
    paths.append(site.getusersitepackages())
paths += site.getsitepackages(prefixes)
print(json.dumps({"version": sys.version.split()[0], "paths": paths}))
"""

# $1: the job's directory. Prints git status's headers ("# branch.oid X", "# branch.head Y"), then
# "dirty HASH" when a tracked file differs from HEAD, or "nogit" where there is no git to ask.
GIT_SCRIPT = """\
command -v git >/dev/null 2>&1 || { echo nogit; exit 0; }
cd -- "$1" 2>/dev/null || exit 0
git --no-optional-locks status --porcelain=v2 --branch --untracked-files=no 2>/dev/null | {
    dirty=0
    while IFS= read -r line; do
        case "$line" in "# "*) printf '%s\\n' "$line" ;; *) dirty=1; break ;; esac
    done
    if [ "$dirty" = 1 ]; then
        printf 'dirty %s\\n' "$(git --no-optional-locks diff HEAD --no-ext-diff --no-textconv --no-color \\
            2>/dev/null | git hash-object --stdin)"
    fi
}
"""

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?")
_SHEBANG_MAX = 256


# --- the interpreter ----------------------------------------------------------------------------------


def resolve_python(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> str | None:
    """The Python the command runs: the program itself (`python3 train.py`), the interpreter its #! line
    names (torchrun, accelerate and every console script of a venv), else the first python3 or python on
    the job's PATH, which is what a shell script (`bash train.sh`) calling `python` runs."""
    search = env.get("PATH", os.defpath)
    program = _program(argv[0], search, cwd) if argv else None
    if program is not None:
        if _PYTHON_NAME.fullmatch(os.path.basename(program)):
            return program
        named = _shebang_python(program, search)
        if named is not None:
            return named
    return which("python3", search) or which("python", search)


def _program(word: str, search: str, cwd: str) -> str | None:
    if "/" in word:
        path = os.path.join(cwd, word)
        return path if os.access(path, os.X_OK) and not os.path.isdir(path) else None
    return which(word, search)


def _shebang_python(path: str, search: str) -> str | None:
    """`#!/venv/bin/python3` or `#!/usr/bin/env python3`: that interpreter; None for any other."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SHEBANG_MAX)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")][:1]  # `env -S python3 -u`
        found = which(words[0], search) if words else None
        return found if found and _PYTHON_NAME.fullmatch(os.path.basename(words[0])) else None
    if words and _PYTHON_NAME.fullmatch(os.path.basename(words[0])):
        return words[0]
    return None


def python_env(env: Mapping[str, str], cwd: str) -> dict[str, str]:
    """The job's environment for its interpreter's answer. `-S` keeps PYTHONPATH's entries as given: a
    relative one means the job's directory, where the snippet does not run."""
    found = dict(env)
    if found.get("PYTHONPATH"):
        parts = found["PYTHONPATH"].split(os.pathsep)
        found["PYTHONPATH"] = os.pathsep.join(os.path.join(cwd, p) if p else p for p in parts)
    return found


def parse_python(output: bytes) -> tuple[str, list[str]] | None:
    """The snippet's answer: (version, directories); None when it gave none."""
    try:
        found = json.loads(output.decode("utf-8", "replace").strip().splitlines()[-1])
        return str(found["version"]), [str(p) for p in found["paths"]]
    except (ValueError, IndexError, KeyError, TypeError):
        return None


# --- the packages ---------------------------------------------------------------------------------------


def installed(paths: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(name, version) of every distribution in those directories, each name once: the first found, as
    an import finds it. Names normalised as pip shows them (PEP 503: `nvidia-cuda-runtime-cu12`)."""
    found: dict[str, str] = {}
    for directory in dict.fromkeys(p for p in paths if p):
        try:
            names = os.listdir(directory)
        except OSError:  # gone, a zip (the standard library's), not a directory
            continue
        for name in names:
            parsed = _distribution(directory, name)
            if parsed is not None:
                found.setdefault(*parsed)
    return tuple(sorted(found.items()))


def _distribution(directory: str, name: str) -> tuple[str, str] | None:
    """A version holds no "-". "torch-2.13.0+cpu.dist-info" (an old tool's may keep a "-" in the name:
    the version is after the last); "foo-1.0-py3.11.egg-info" (egg names have none: after the first);
    "foo.egg-info" of `setup.py develop` names none: its PKG-INFO says."""
    if name.endswith(".dist-info"):
        project, _, version = name[: -len(".dist-info")].rpartition("-")
        metadata = "METADATA"
    elif name.endswith(".egg-info"):
        project, _, rest = name[: -len(".egg-info")].partition("-")
        version, metadata = rest.split("-", 1)[0], "PKG-INFO"
    else:
        return None
    found = version or _metadata_version(os.path.join(directory, name), metadata)
    return (_normalised(project), found) if project and found else None


def _metadata_version(path: str, metadata: str) -> str | None:
    """The Version: header of a distribution's metadata (a directory's file, or an egg-info file itself)."""
    target = path if os.path.isfile(path) else os.path.join(path, metadata)
    try:
        with open(target, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the headers end at the first blank line
                if line.lower().startswith("version:"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        return None
    return None


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def torch_cuda(paths: Iterable[str]) -> str | None:
    """torch.version.cuda as the torch an import would find was built (None: a CPU build, or no torch),
    read from its version.py, without importing torch."""
    for directory in dict.fromkeys(p for p in paths if p):
        try:
            with open(os.path.join(directory, "torch", "version.py"), encoding="utf-8") as fh:
                text = fh.read(4096)
        except OSError:
            continue
        found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        return found.group(1) if found else None
    return None


# --- git ------------------------------------------------------------------------------------------------


def parse_git(output: bytes) -> GitState | str | None:
    """GIT_SCRIPT's answer: the state; None outside a repository; "nogit" where git is not installed."""
    text = output.decode("utf-8", "replace")
    if text.strip() == "nogit":
        return "nogit"
    lines = text.splitlines()
    headers = dict(line[2:].partition(" ")[::2] for line in lines if line.startswith("# "))
    if "branch.oid" not in headers:
        return None
    commit = headers["branch.oid"].strip()
    branch = headers.get("branch.head", "").strip()
    dirty = next((line[len("dirty ") :].strip() for line in lines if line.startswith("dirty ")), None)
    return GitState(
        commit=None if commit == "(initial)" else commit,
        branch=None if branch in ("", "(detached)") else branch,
        dirty=dirty is not None,
        diff_hash=dirty or None,
    )


# --- the machine ----------------------------------------------------------------------------------------


def host() -> str:
    return os.uname().nodename


def visible_gpus(devices: Sequence[GpuDevice], cuda_visible: str | None) -> tuple[str, ...]:
    """The GPUs a job with this CUDA_VISIBLE_DEVICES can use, in its order, as "0 NVIDIA H100 GPU-1a2b3c4d"
    (the index nvidia-smi shows; the start of the UUID tells one card of a model from another). CUDA reads
    the list up to its first entry that names no GPU."""
    if cuda_visible is None:
        chosen = list(devices)
    else:
        chosen = []
        for word in (w.strip() for w in cuda_visible.split(",")):
            match = next((d for d in devices if _names(word, d)), None)
            if match is None:
                break
            chosen.append(match)
    return tuple(f"{d.index} {d.name} {d.uuid[:12]}" for d in chosen)


def _names(word: str, device: GpuDevice) -> bool:
    if word.isdigit():
        return int(word) == device.index
    return bool(word) and device.uuid.startswith(word)


def cuda_version(raw: int | None) -> str | None:
    """NVML's CUDA driver version (12040) as CUDA writes it: 12.4."""
    return None if raw is None else f"{raw // 1000}.{raw % 1000 // 10}"
