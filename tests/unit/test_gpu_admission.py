"""GPU admission: which GPUs are free, claims through the store, who holds the others, and the line
`status` shows for a queued run. NVML is the fake one, /proc a tree built in a temporary directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobwarden.errors import UsageError
from jobwarden.joboptions import JobOptions
from jobwarden.model import JobSpec, JobState, ProcessSnapshot
from jobwarden.observations import GpuDevice, GpuProcess
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import fakenvml
from jobwarden.probes.gpu import GpuProbe, GpuUnavailable, open_gpu_probe
from jobwarden.rules.gpu import stray_gpu_findings
from jobwarden.shim.admission.gpuholders import gpu_owners
from jobwarden.shim.admission.gpus import (
    Admission,
    BusyGpu,
    GpuHolder,
    GpuRequest,
    describe_wait,
    free_gpus,
    gpu_env,
    gpu_holders,
    live_claims,
    try_admit,
)
from jobwarden.store import Store

GIB = 1 << 30
NOW = 1_700_000_000.0
BOOT = 1_699_990_000


def dev(index: int, used: int = 0) -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}", "H100", 80 * GIB, used, 0.0)


# --- free_gpus ---------------------------------------------------------------------------------------


def test_a_gpu_with_a_compute_process_is_busy_whatever_its_size() -> None:
    assert free_gpus([dev(0), dev(1)], [GpuProcess(0, 5, 300 << 20)], {}) == [1]


def test_a_small_graphics_process_leaves_the_gpu_free() -> None:
    assert free_gpus([dev(0, 200 << 20)], [GpuProcess(0, 77, 200 << 20, "graphics")], {}) == [0]
    assert free_gpus([dev(0)], [GpuProcess(0, 77, 0, "compute+graphics")], {}) == []


def test_memory_in_use_by_no_listed_process_counts_from_the_threshold() -> None:
    devices = [dev(0, GIB - 1), dev(1, GIB), dev(2, 6 * GIB)]
    assert free_gpus(devices, [], {}) == [0]
    assert free_gpus(devices, [], {}, memory_threshold_bytes=8 * GIB) == [0, 1, 2]


def test_claimed_and_unreadable_gpus_are_not_free() -> None:
    # GPU 2 is missing from the devices: NVML could not read it
    assert free_gpus([dev(3), dev(0), dev(1)], [], {1: (4, 1)}) == [0, 3]


# --- requests ----------------------------------------------------------------------------------------


def test_requests_by_count_or_ids() -> None:
    assert GpuRequest.of(count=2) == GpuRequest(2)
    assert GpuRequest.of(ids=[3, 0]) == GpuRequest(2, (3, 0))
    assert GpuRequest.from_options(JobOptions(gpus=2)) == GpuRequest(2)
    assert GpuRequest.from_options(JobOptions(gpu_ids=(1,))) == GpuRequest(1, (1,))
    assert GpuRequest.from_options(JobOptions()) is None
    assert GpuRequest(1).describe() == "1 free GPU"
    assert GpuRequest(2, (0, 3)).describe() == "GPUs 0,3"


@pytest.mark.parametrize(
    ("count", "ids"),
    [(None, None), (1, [0]), (0, None), (-1, None), (None, []), (None, [-1]), (None, [1, 1])],
)
def test_bad_requests_are_usage_errors(count: int | None, ids: list[int] | None) -> None:
    with pytest.raises(UsageError):
        GpuRequest.of(count, ids)


def test_the_job_sees_its_gpus_in_pci_order() -> None:
    assert gpu_env([0, 3]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,3"}


# --- describe_wait -----------------------------------------------------------------------------------


def holder(pid: int, gpu: int, used: int | None, **fields: Any) -> GpuHolder:
    base: dict[str, Any] = {"uid": 1000, "user": "ana", "cmdline": "python loop.py", "ppid": 1}
    return GpuHolder(pid, gpu, used, "compute", True, **{**base, **fields})


def test_the_wait_line_names_each_holder() -> None:
    admission = Admission(
        GpuRequest(2),
        busy=(
            BusyGpu(
                0,
                6 * GIB,
                (holder(4242, 0, int(5.1 * GIB), job_id=12, run=1, job_name="train", live_job=True),),
            ),
            BusyGpu(1, 6 * GIB, (holder(999, 1, int(5.5 * GIB)),)),
        ),
    )
    assert describe_wait(admission) == (
        "waiting for 2 free GPUs: GPU 0 held by job 12 (train) pid 4242 5.1 GiB; "
        "GPU 1 held by stray pid 999 (user ana, python loop.py) 5.5 GiB"
    )


def test_the_wait_line_for_claims_leftovers_hidden_holders_and_lost_gpus() -> None:
    admission = Admission(
        GpuRequest(2, (0, 1, 2, 3)),
        busy=(
            BusyGpu(0, 0, claimed_by=(7, 2), claimed_by_name="eval"),
            BusyGpu(1, 3 * GIB, (holder(55, 1, 3 * GIB, job_id=4, run=1, job_name="old", ppid=1),)),
            BusyGpu(2, 5 * GIB),
            BusyGpu(3, unreadable="GPU is lost"),
        ),
    )
    assert describe_wait(admission) == (
        "waiting for GPUs 0,1,2,3: GPU 0 claimed by job 7 (eval) run 2; "
        "GPU 1 held by stray pid 55 (left by job 4 (old) run 1, user ana, python loop.py) 3.0 GiB; "
        "GPU 2 has 5.0 GiB in use by no process NVML lists (another container or VM?); "
        "GPU 3 unreadable (GPU is lost)"
    )


def test_the_wait_line_counts_free_gpus_and_shortens_commands() -> None:
    long_cmd = "python -m torch.distributed.run --nproc-per-node 8 train.py --config big.yaml"
    admission = Admission(
        GpuRequest(2), free=(3,), busy=(BusyGpu(0, GIB, (holder(9, 0, None, cmdline=long_cmd),)),)
    )
    assert describe_wait(admission) == (
        "waiting for 2 free GPUs (1 free now): "
        "GPU 0 held by stray pid 9 (user ana, python -m torch.distributed.run --npr...) memory n/a"
    )


def test_the_wait_line_shows_the_biggest_holders_of_a_crowded_gpu() -> None:
    holders = tuple(
        holder(100 + i, 0, (i + 1) * GIB, job_id=3, job_name="ddp", live_job=True) for i in range(5)
    )
    admission = Admission(GpuRequest(1, (0,)), busy=(BusyGpu(0, 15 * GIB, holders),))
    assert describe_wait(admission) == (
        "waiting for GPU 0: GPU 0 held by job 3 (ddp) pid 104 5.0 GiB, job 3 (ddp) pid 103 4.0 GiB, "
        "job 3 (ddp) pid 102 3.0 GiB, 2 more"
    )


def test_the_wait_line_when_admitted_impossible_or_unreadable() -> None:
    assert describe_wait(Admission(GpuRequest(2), claimed=(0, 3))) == "claimed GPUs 0,3"
    assert describe_wait(Admission(GpuRequest(9), impossible="asks for 9 GPUs, this machine has 8")) == (
        "asks for 9 GPUs, this machine has 8"
    )
    assert describe_wait(Admission(GpuRequest(1), error="cannot read the GPUs: Driver not loaded")) == (
        "waiting for 1 free GPU: cannot read the GPUs: Driver not loaded"
    )


# --- try_admit against a real store, the fake NVML and a built /proc ------------------------------------


def stat_line(pid: int, ppid: int, start: int, comm: str = "python") -> str:
    fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "4194304"] + ["0"] * 12 + [str(start)]
    fields += ["88453120", "2362"] + ["0"] * 28
    return f"{pid} ({comm}) {' '.join(fields)}\n"


class FakeProc:
    """A /proc tree under a temporary directory, with the files gpu_holders reads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        (root / "stat").write_text(f"cpu  1 0 1 1 0 0 0 0 0 0\nbtime {BOOT}\n")
        self.procfs = ProcFS(root)

    def add(self, pid: int, cmdline: str, env: dict[str, str] | None = None, ppid: int = 1) -> int:
        d = self.root / str(pid)
        d.mkdir()
        (d / "stat").write_text(stat_line(pid, ppid, start=pid * 100))
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))
        return pid * 100


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store(tmp_path / "home") as opened:
        yield opened


@pytest.fixture
def nvml(tmp_path: Path) -> Path:
    path = tmp_path / "nvml.json"
    fakenvml.write_state(path, {"devices": [fakenvml.device(i) for i in range(4)]})
    return path


@pytest.fixture
def probe(nvml: Path) -> Any:
    opened = open_gpu_probe({fakenvml.FAKE_NVML_ENV: str(nvml)})
    yield opened
    assert opened is not None
    opened.close()


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def new_job(store: Store, name: str, state: JobState = JobState.QUEUED) -> int:
    spec = JobSpec(command=("python", f"{name}.py"), cwd="/srv", name=name)
    job_id, _ = store.create_job(spec, {}, NOW, state)
    return job_id


def admit(store: Store, job: int, probe: GpuProbe, proc: FakeProc, **request: Any) -> Admission:
    return try_admit(store, job, 1, probe, **request, now=NOW, procfs=proc.procfs)


def test_a_run_claims_the_lowest_free_gpus(store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path) -> None:
    fakenvml.hold(nvml, 0, 50, 2 * GIB)
    job = new_job(store, "train")
    admission = admit(store, job, probe, proc, count=2)
    assert admission.admitted and admission.claimed == (1, 2)
    assert admission.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,2"}
    assert store.gpu_claims() == {1: (job, 1), 2: (job, 1)}
    assert store.run(job).gpu_ids == (1, 2)
    # asking again (a shim restarted mid-admission) returns the same claim, claiming nothing more
    assert admit(store, job, probe, proc, count=2).claimed == (1, 2)
    assert len(store.gpu_claims()) == 2


def test_claims_of_live_runs_block_and_those_of_ended_runs_do_not(
    store: Store, probe: GpuProbe, proc: FakeProc
) -> None:
    first, second = new_job(store, "a"), new_job(store, "b")
    assert admit(store, first, probe, proc, ids=[0, 1]).claimed == (0, 1)
    waiting = admit(store, second, probe, proc, ids=[1, 2])
    assert not waiting.admitted and store.gpu_claims() == {0: (first, 1), 1: (first, 1)}
    assert describe_wait(waiting) == "waiting for GPUs 1,2: GPU 1 claimed by job 1 (a) run 1"
    assert live_claims(store) == {0: (first, 1), 1: (first, 1)}
    store.update_run(first, 1, state=JobState.FAILED)  # the first run ended
    assert live_claims(store) == {}
    assert admit(store, second, probe, proc, ids=[1, 2]).claimed == (1, 2)


def test_a_lost_run_keeps_its_claim(store: Store, probe: GpuProbe, proc: FakeProc) -> None:
    first, second = new_job(store, "a"), new_job(store, "b")
    admit(store, first, probe, proc, ids=[0])
    store.update_run(first, 1, state=JobState.LOST)  # its processes may still be on the GPU
    assert not admit(store, second, probe, proc, ids=[0]).admitted


def test_gpu_ids_are_all_or_nothing(store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path) -> None:
    fakenvml.hold(nvml, 3, 60, GIB)
    job = new_job(store, "pinned")
    waiting = admit(store, job, probe, proc, ids=[0, 3])
    assert not waiting.admitted and store.gpu_claims() == {}
    assert [b.index for b in waiting.busy] == [3]  # only the named GPUs are explained
    fakenvml.release(nvml, 60)
    assert admit(store, job, probe, proc, ids=[0, 3]).claimed == (0, 3)


def test_a_request_this_machine_can_never_meet_is_impossible(
    store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path
) -> None:
    job = new_job(store, "big")
    assert admit(store, job, probe, proc, count=5).impossible == "asks for 5 GPUs, this machine has 4"
    assert admit(store, job, probe, proc, ids=[1, 4, 7]).impossible == (
        "no GPU 4,7 here: this machine has 4 GPUs (0-3)"
    )
    # a GPU that cannot be read still exists: wait for it rather than fail
    fakenvml.update_state(nvml, lambda s: s["devices"][3].update(error="GpuIsLost"))
    lost = admit(store, job, probe, proc, ids=[3])
    assert lost.impossible is None
    assert describe_wait(lost) == "waiting for GPU 3: GPU 3 unreadable (GPU is lost)"
    assert store.gpu_claims() == {}


def test_without_nvml_a_gpu_job_cannot_run(store: Store, proc: FakeProc) -> None:
    job = new_job(store, "nogpu")
    none = try_admit(store, job, 1, None, count=1, now=NOW, procfs=proc.procfs)
    assert none.impossible and "NVML is not available" in none.impossible
    why = GpuUnavailable("NVML cannot start: Driver not loaded", "check `nvidia-smi`")
    assert try_admit(store, job, 1, why, count=1, now=NOW).impossible == (
        "cannot use GPUs on this machine: NVML cannot start: Driver not loaded (check `nvidia-smi`)"
    )


def test_an_nvml_failure_while_queued_means_wait(
    store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path
) -> None:
    job = new_job(store, "train")
    fakenvml.update_state(nvml, lambda s: s.update(error="DriverNotLoaded"))
    waiting = admit(store, job, probe, proc, count=1)
    assert not waiting.admitted and waiting.impossible is None
    assert describe_wait(waiting) == (
        "waiting for 1 free GPU: cannot read the GPUs: Driver not loaded "
        "(the NVIDIA kernel driver is not loaded; check `nvidia-smi`)"
    )
    fakenvml.update_state(nvml, lambda s: s.update(error=None))
    assert admit(store, job, probe, proc, count=1).claimed == (0,)


def test_a_new_attempt_takes_over_the_claims_of_the_last(
    store: Store, probe: GpuProbe, proc: FakeProc
) -> None:
    job = new_job(store, "train")
    admit(store, job, probe, proc, ids=[2])
    store.update_run(job, 1, state=JobState.RESTARTING)
    run2 = store.new_run(job, JobState.QUEUED, NOW)
    assert try_admit(store, job, run2, probe, ids=[2], now=NOW, procfs=proc.procfs).claimed == (2,)
    assert store.gpu_claims() == {2: (job, run2)}


def test_holders_are_named_by_job_record_marker_or_as_strays(
    store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path
) -> None:
    home = str(store.layout.home)
    live, ended, waiting = (
        new_job(store, "train", JobState.RUNNING),
        new_job(store, "old"),
        new_job(store, "b"),
    )
    store.update_run(ended, 1, state=JobState.FAILED)
    marks = {"JOBWARDEN_HOME": home, "JOBWARDEN_RUN": "1", "SECRET": "x"}
    proc.add(4242, "python train.py", {**marks, "JOBWARDEN_JOB_ID": str(live)}, ppid=4200)
    proc.add(555, "python old.py", {**marks, "JOBWARDEN_JOB_ID": str(ended)})
    proc.add(999, "python loop.py")
    start = proc.add(777, "python worker.py", {}, ppid=4242)  # a job's process that cleared its environment
    snapshot = ProcessSnapshot(777, 4242, start, "S", "python worker.py", 1 << 20, None)
    store.record_tree(live, 1, NOW, [snapshot], [])
    for gpu, pid, size in ((0, 4242, 5.1), (0, 777, 1.0), (1, 999, 5.5), (2, 555, 3.0), (3, 31337, 2.0)):
        fakenvml.hold(nvml, gpu, pid, int(size * GIB))
    waiting_for = admit(store, waiting, probe, proc, count=1)
    assert describe_wait(waiting_for) == (
        "waiting for 1 free GPU: "
        "GPU 0 held by job 1 (train) pid 4242 5.1 GiB, job 1 (train) pid 777 1.0 GiB; "
        "GPU 1 held by stray pid 999 (user root, python loop.py) 5.5 GiB; "
        "GPU 2 held by stray pid 555 (left by job 2 (old) run 1, user root, python old.py) 3.0 GiB; "
        "GPU 3 held by pid 31337 (not visible here: another container or PID namespace?) 2.0 GiB"
    )
    by_pid = {h.pid: h for b in waiting_for.busy for h in b.holders}
    assert by_pid[4242].live_job and not by_pid[4242].reparented_to_init and by_pid[4242].ppid == 4200
    assert by_pid[4242].started_at == BOOT + 4242 * 100 / proc.procfs.ticks_per_s
    assert (by_pid[777].job_id, by_pid[777].run, by_pid[777].live_job) == (live, 1, True)
    assert by_pid[999].stray and by_pid[999].job_id is None and by_pid[999].reparented_to_init
    assert by_pid[555].stray and (by_pid[555].job_id, by_pid[555].run) == (ended, 1)
    assert not by_pid[31337].visible and not by_pid[31337].stray
    assert "SECRET" not in str(by_pid[4242].to_json())


def test_a_graphics_process_is_shown_but_never_a_stray(
    store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path
) -> None:
    job = new_job(store, "b")
    proc.add(77, "/usr/lib/xorg/Xorg :0")
    fakenvml.hold(nvml, 0, 77, 3 * GIB, kind="graphics")  # a big desktop: over the threshold
    waiting = admit(store, job, probe, proc, ids=[0])
    (busy,) = waiting.busy
    (xorg,) = busy.holders
    assert not xorg.stray and xorg.job_id is None
    assert describe_wait(waiting) == (
        "waiting for GPU 0: GPU 0 held by graphics pid 77 (user root, /usr/lib/xorg/Xorg :0) 3.0 GiB"
    )


def test_a_process_of_another_jobwarden_home_is_not_called_a_stray(
    store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path
) -> None:
    job = new_job(store, "b")
    other = {
        "JOBWARDEN_HOME": "/home/bo/.local/state/jobwarden",
        "JOBWARDEN_JOB_ID": "1",
        "JOBWARDEN_RUN": "1",
    }
    proc.add(321, "python bo.py", other)
    fakenvml.hold(nvml, 0, 321, GIB)
    waiting = admit(store, job, probe, proc, ids=[0])
    (busy,) = waiting.busy
    (theirs,) = busy.holders
    assert theirs.foreign and not theirs.stray and theirs.job_name is None
    assert theirs.label() == (
        "pid 321 of jobwarden job 1 under /home/bo/.local/state/jobwarden (user root, python bo.py)"
    )


def test_holders_feed_the_stray_gpu_rule(store: Store, probe: GpuProbe, proc: FakeProc, nvml: Path) -> None:
    live, ended = new_job(store, "train", JobState.RUNNING), new_job(store, "old", JobState.FAILED)
    marks = {"JOBWARDEN_HOME": str(store.layout.home), "JOBWARDEN_RUN": "1"}
    proc.add(4242, "python train.py", {**marks, "JOBWARDEN_JOB_ID": str(live)})
    proc.add(555, "python old.py", {**marks, "JOBWARDEN_JOB_ID": str(ended)})
    proc.add(999, "python loop.py")
    proc.add(77, "Xorg :0")
    proc.add(321, "python bo.py", {**marks, "JOBWARDEN_HOME": "/elsewhere", "JOBWARDEN_JOB_ID": "1"})
    for pid, kind in (
        (4242, "compute"),
        (555, "compute"),
        (999, "compute"),
        (77, "graphics"),
        (321, "compute"),
    ):
        fakenvml.hold(nvml, 0, pid, 2 * GIB, kind=kind)
    holders = gpu_holders(store, probe, proc.procfs)
    owners = gpu_owners(holders, now=BOOT + 4242.0)
    assert sorted(owners) == [555, 999, 4242]
    assert owners[555].job_id == str(ended) and not owners[555].job_live
    assert owners[4242].job_live and owners[999].job_id is None and owners[999].ppid == 1
    assert owners[999].age_s == pytest.approx(4242 - 999 * 100 / proc.procfs.ticks_per_s)
    findings = stray_gpu_findings(probe.processes(), owners)
    assert sorted(f.pids for f in findings) == [(555,), (999,)]
    assert {f.rule for f in findings} == {"stray-gpu-process"}
