"""One Ray cluster for all the Ray tests (this package) (a head starts in 5-21 s), in its own namespaces: see
raycluster.py. Without Ray or root the tests skip, and fail in CI, which must run them."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MEASURED
from tests.ray.raycluster import RayNamespace
from tests.support import unavailable


def _missing() -> str | None:
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "ray").exists():
        return f"no ray in {bin_dir} (scripts/setup --dev installs the `ray` extra)"
    if os.geteuid() != 0:
        return "the Ray tests need root for their network and pid namespaces"
    if not shutil.which("unshare") or not shutil.which("nsenter"):
        return "the Ray tests need unshare and nsenter (util-linux)"
    return None


def require_ray() -> None:
    """Skip without Ray or root; fail in CI, which must run the Ray tests."""
    why = _missing()
    if why:
        unavailable(why)


@pytest.fixture(scope="package")  # ends with the last Ray test: idle daemons slow the rest
def ray_ns() -> Iterator[RayNamespace]:
    require_ray()
    ns = RayNamespace(Path(sys.executable).parent)
    try:
        ns.open()
        ns.start_head()
        ns.start_second_node()
        TIMINGS["ray head start in the namespace (s)"] = ns.head_start_s
        yield ns
    finally:
        ns.close()


TIMINGS = MEASURED.setdefault("ray", {})  # what the Ray tests measured, shown at the end of the session
