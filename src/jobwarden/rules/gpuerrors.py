"""What the GPU stack's own error texts say about a failure, and what to do about each (the texts are parsed
by rules.mltext.gpu_errors). They sharpen the finding about the process that died (a RuntimeError that is
really a device-side assert, a SIGABRT that is NCCL's watchdog) rather than stand as findings of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from jobwarden.rules import mltext

_REMEDIES = {
    "cuda-kernel-assert": "a kernel's assertion failed on the GPU (an index out of range: a label >= the "
    "number of classes, an embedding index >= its size): check the inputs of the op named in the assertion",
    "cuda-device-assert": "a GPU kernel's assertion failed; CUDA reports it late, at a later call: rerun "
    "with CUDA_LAUNCH_BLOCKING=1 (or on the CPU) to see the op that failed, and check its indices",
    "cublas": "cuBLAS refused the call: CUBLAS_STATUS_ALLOC_FAILED / NOT_INITIALIZED usually mean the GPU "
    "memory was exhausted; EXECUTION_FAILED / INVALID_VALUE a bad shape or an earlier CUDA error "
    "(rerun with CUDA_LAUNCH_BLOCKING=1)",
    "cuda-illegal-memory-access": "a kernel read or wrote out of bounds; the CUDA context is lost: rerun "
    "with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer to find the op; check custom kernels and extensions",
    "nccl-timeout": "a collective timed out: the rank that reports it is often a victim of a peer that "
    "never joined; compare every rank's stacks (`jobwarden dump`) and the flight recorder "
    "(on in jobwarden's Python jobs; TORCH_NCCL_DUMP_ON_TIMEOUT=1 dumps it at the timeout)",
    "gpu-ecc": "the GPU reported an uncorrectable memory (ECC) error: a hardware fault; drain the node, "
    "reset the GPU (`nvidia-smi -r`) or have it replaced, and resume from the last checkpoint elsewhere",
    "gpu-off-bus": "the GPU fell off the bus (Xid 79): power, thermal or hardware trouble; the node needs "
    "a reset before any job can use that GPU again",
    "nccl-duplicate-gpu": "two ranks use the same GPU, which NCCL refuses: give each rank its own "
    "(torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group), run no more ranks "
    "per node than GPUs (--nproc_per_node), or use the gloo backend to test on fewer GPUs",
    "gloo-size-mismatch": "the ranks called a collective with tensors of different sizes (a collective "
    "mismatch): gloo aborted the rank that received more than it expected, and its peer sent the larger "
    "tensor; every rank must call the same collectives in the same order with the same shapes (look for a "
    "shape that depends on the rank or on its data: the last batch, padding, a filtered list)",
    "xid": "the NVIDIA driver logged an Xid error: look it up in NVIDIA's Xid catalog; resume from the last "
    "checkpoint, and drain the node if it repeats",
}


class GpuContext(NamedTuple):
    evidence: tuple[str, ...]
    remedy: str  # "" when the output holds none of the known texts
    cause: str = ""  # what the death was, where the text says it plainly: a title's ending


def gpu_context(lines: Sequence[str]) -> GpuContext:
    """The known GPU-stack error lines of `lines`, and the remedy of the most telling one: the first that
    appeared, since the later ones usually follow from it."""
    found = mltext.gpu_errors(lines)
    if not found:
        return GpuContext((), "")
    evidence = tuple(f"{_stack(e.kind)} ({e.kind}): {e.line.strip()}" for e in found[:4])
    first = found[0]
    cause = ""
    if first.kind == "gloo-size-mismatch":
        cause = "a collective size mismatch" + (f" (gloo received {first.code})" if first.code else "")
    return GpuContext(evidence, _REMEDIES[first.kind] + ".", cause)


def _stack(kind: str) -> str:
    return "gloo" if kind.startswith("gloo") else "GPU stack"
