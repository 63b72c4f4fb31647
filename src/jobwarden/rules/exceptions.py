"""What to do about an uncaught Python exception: the remedy adds what the error alone does not say.

"fix the error at train.py:1" is no help for `ModuleNotFoundError: No module named 'torch'`: the module is
there, for another interpreter. The interpreter that ran the process (the hooks' advert) and the package
that provides the module are what the user needs; a relative path not found depends on the directory the
job ran in. Pure: the exception's type and message, where it was raised, and the interpreter, if known.
"""

from __future__ import annotations

import re

# import name -> the distribution that provides it, where they differ (pip cannot guess these)
PACKAGE_OF = {
    "cv2": "opencv-python",
    "sklearn": "scikit-learn",
    "yaml": "pyyaml",
    "PIL": "pillow",
    "skimage": "scikit-image",
    "bs4": "beautifulsoup4",
    "attr": "attrs",
    "dateutil": "python-dateutil",
    "google.protobuf": "protobuf",
    "Crypto": "pycryptodome",
}
_NO_MODULE = re.compile(r"No module named '([^']+)'")
_NO_FILE = re.compile(r"No such file or directory: '([^']*)'")


def exception_remedy(exc_type: str, message: str, frame: str | None, executable: str | None) -> str:
    """The remedy of a `python-exception` finding."""
    if exc_type == "ModuleNotFoundError":
        missing = _NO_MODULE.search(message)
        if missing is not None:
            return _module_remedy(missing.group(1), executable)
    if exc_type == "FileNotFoundError":
        path = _NO_FILE.search(message)
        if path is not None and not path.group(1).startswith("/"):
            return (
                f"'{path.group(1)}' is a relative path: it was looked for in the job's working directory "
                "(`jobwarden status` shows it as cwd); run the job with --cwd where the file is, or give "
                f"an absolute path; the error was raised at {frame or 'the innermost frame'}"
            )
    return f"fix the error at {frame or 'the innermost frame'}; `jobwarden logs` shows the traceback"


def _module_remedy(module: str, executable: str | None) -> str:
    top = module.split(".")[0]
    package = PACKAGE_OF.get(module) or PACKAGE_OF.get(top) or top
    own = f"; if '{top}' is the project's own code, run the job from its directory (--cwd) or put it on "
    own += "PYTHONPATH"
    if executable:
        return (
            f"the module '{top}' is not installed for the interpreter that ran the job, {executable}: "
            f"install it there (`{executable} -m pip install {package}`), or run the job with the "
            f"interpreter whose environment has it (its venv's python){own}"
        )
    return (
        f"the module '{top}' is not installed for the Python that ran the job: install it into that "
        f"environment (`python -m pip install {package}` with that python), or run the job with the "
        f"interpreter whose environment has it (its venv's python){own}"
    )
