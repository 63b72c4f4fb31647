"""A GPU request (`--gpus N`, `--gpu-ids I,J`) and whether a machine can ever meet it: pure, read by the
shim's admission (shim.admission.gpus) and by `run`'s refusal before anything is recorded
(control.gpurequest), as rules.retry's policy is read from the options. Loaded only for a run that asks for
GPUs: `run` must not pay `dataclasses` otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobwarden.config import counted
from jobwarden.errors import UsageError
from jobwarden.joboptions import JobOptions


@dataclass(frozen=True)
class GpuRequest:
    """`--gpus N` (any N free GPUs) or `--gpu-ids I,J` (exactly those)."""

    count: int
    ids: tuple[int, ...] | None = None

    @classmethod
    def of(cls, count: int | None = None, ids: Sequence[int] | None = None) -> GpuRequest:
        if (count is None) == (ids is None):
            raise UsageError("ask for GPUs by count or by ids, not both (or neither)")
        if ids is not None:
            if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
                raise UsageError(f"bad GPU ids {list(ids)}", "give distinct GPU indexes >= 0, e.g. 0,3")
            return cls(len(ids), tuple(ids))
        if count is None or count < 1:
            raise UsageError(f"bad GPU count {count}", "ask for at least 1 GPU")
        return cls(count)

    @classmethod
    def from_options(cls, options: JobOptions) -> GpuRequest | None:
        """The request a job asked for (--gpus, --gpu-ids), None for a job without GPUs."""
        if options.gpu_ids:
            return cls.of(ids=list(options.gpu_ids))
        return cls.of(count=options.gpus) if options.gpus else None

    def describe(self) -> str:
        if self.ids is not None:
            return f"GPU{'s' if len(self.ids) > 1 else ''} {cuda_visible_devices(self.ids)}"
        return f"{self.count} free GPU{'s' if self.count > 1 else ''}"


def impossible_request(request: GpuRequest, total: int) -> str | None:
    """Why a machine with `total` GPUs can never meet `request`; None when it can."""
    if request.ids is not None:
        missing = [i for i in request.ids if i >= total]
        if missing:
            return (
                f"no GPU {cuda_visible_devices(missing)} here: this machine has {counted(total, 'GPU')}"
                + (f" (0-{total - 1})" if total else "")
            )
    elif request.count > total:
        return f"asks for {request.count} GPUs, this machine has {total}"
    return None


def cuda_visible_devices(indexes: Sequence[int]) -> str:
    return ",".join(str(i) for i in indexes)
