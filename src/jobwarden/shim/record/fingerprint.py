"""The run's fingerprint (observations.Fingerprint), taken by the shim at each launch, restarts included.

Never on the path of `run` (it starts once the CLI has its answer), never inside the job's process tree or
its cgroup, never in the loop's way: the two helpers that need another program (probes.fingerprint:
git's state, the job's interpreter's paths) are started at once, each in a session of its own, their
output going to memory files; the loop looks at them on its ticks, and once both are done the rest (the
package names read from the paths, the GPUs) takes about a millisecond. A helper still running after
TIMEOUT_S is killed with its session and its part recorded as unknown, with why. The run's end waits for
the fingerprint (FINISH_WAIT_S at most), so that an ended run has one: `jobwarden diff` right after `run
-w` finds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from jobwarden import __version__
from jobwarden.errors import JobwardenError
from jobwarden.observations import Fingerprint, GitState
from jobwarden.osapi import pidfd as pidfds
from jobwarden.osapi.tool import Captured, captured_output, end_captured, start_captured
from jobwarden.osapi.waiting import wait_readable
from jobwarden.probes import fingerprint as probe
from jobwarden.shim.watch.gpuwatch import GpuWatch, gpus_expected
from jobwarden.store import JobRecord

TIMEOUT_S = 10.0  # git status on a large repository with a cold cache takes seconds; past this, unknown
FINISH_WAIT_S = 2.0  # at the run's end, how long the end waits for helpers still running
_OUTPUT_MAX = 1 << 20  # their answers are a few hundred bytes; a broken one is not read past this
_SHELL = "/bin/sh"


class FingerprintTask:
    """One launch's fingerprint: the helpers while they run, then the fingerprint once."""

    def __init__(self, job: JobRecord, env: Mapping[str, str], monotonic: Callable[[], float]) -> None:
        """`env`: the job's environment (its --env values and claimed GPUs), without jobwarden's own."""
        # none of jobwarden's variables either (the shim's own environment has JOBWARDEN_HOME and may have
        # more): a helper carrying a job's markers is taken for a process of the job by the marker scan,
        # and a helper that ends with a non-zero code (pyenv's shim runs `readlink`) became its root cause
        env = {k: v for k, v in env.items() if not k.startswith("JOBWARDEN_")}
        self.job, self.monotonic = job, monotonic
        self.cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
        self.started = monotonic()
        self.deadline = self.started + TIMEOUT_S
        self.python = probe.resolve_python(job.command, env, job.cwd)
        self.unknown: dict[str, str] = {}
        self.answers: dict[str, bytes | None] = {}  # None: it overran its deadline
        self.helpers: dict[str, Captured] = {}
        self._start("git", [_SHELL, "-c", probe.GIT_SCRIPT, "sh", job.cwd], env)
        if self.python is not None:
            pyenv = probe.python_env(env, job.cwd)
            self._start("python", [self.python, "-S", "-B", "-c", probe.PY_SNIPPET], pyenv)

    def _start(self, part: str, argv: list[str], env: Mapping[str, str]) -> None:
        try:
            self.helpers[part] = start_captured(argv, env)
        except JobwardenError as err:
            self.unknown[part] = err.message

    def elapsed_ms(self) -> float:
        return (self.monotonic() - self.started) * 1000

    def helper_pids(self) -> set[int]:
        """The helpers still running: the shim's, never the job's."""
        return {h.pid for h in self.helpers.values()}

    def done(self) -> bool:
        """Collect the helpers that ended, kill those past the deadline; True once none is left."""
        overdue = self.monotonic() >= self.deadline
        for part, helper in list(self.helpers.items()):
            ended = helper.pidfd < 0 or pidfds.has_exited(helper.pidfd)
            if ended or overdue:
                self.answers[part] = captured_output(helper, _OUTPUT_MAX) if ended else None
                end_captured(helper)
                del self.helpers[part]
        return not self.helpers

    def wait(self, at_most_s: float) -> None:
        """Wait up to `at_most_s` for the helpers still running (the run's end)."""
        until = min(self.deadline, self.monotonic() + at_most_s)
        while not self.done() and self.monotonic() < until:
            wait_readable([h.pidfd for h in self.helpers.values() if h.pidfd >= 0], until - self.monotonic())
        self.deadline = min(self.deadline, self.monotonic())
        self.done()

    def result(self, gpu: GpuWatch | None) -> Fingerprint:
        """The fingerprint from what the helpers answered (call once `done`)."""
        git = self._git()
        version, paths = self._python()
        packages = probe.installed(paths) if paths is not None else None
        gpus, driver, cuda_driver = self._gpus(gpu)
        return Fingerprint(
            command=self.job.command,
            cwd=self.job.cwd,
            env_keys=tuple(sorted(self.job.env)),
            host=probe.host(),
            jobwarden=__version__,
            python=self.python,
            python_version=version,
            packages=packages,
            torch_cuda=probe.torch_cuda(paths) if paths is not None else None,
            git=git,
            cuda_visible=self.cuda_visible,
            gpus=gpus,
            driver=driver,
            cuda_driver=cuda_driver,
            unknown=tuple(sorted(self.unknown.items())),
        )

    def _git(self) -> GitState | None:
        answer = self._answer("git")
        if answer is None:
            return None
        state = probe.parse_git(answer)
        if state == "nogit":
            self.unknown["git"] = "git is not installed"
            return None
        return state if isinstance(state, GitState) else None

    def _python(self) -> tuple[str | None, list[str] | None]:
        if self.python is None:
            return None, None
        answer = self._answer("python")
        parsed = probe.parse_python(answer) if answer is not None else None
        if parsed is None:
            self.unknown.setdefault("python", f"{self.python} gave no answer")
            self.unknown["packages"] = self.unknown["python"]
            return None, None
        return parsed

    def _answer(self, part: str) -> bytes | None:
        if part in self.unknown:
            return None
        answer = self.answers.get(part)
        if answer is None:
            self.unknown[part] = f"no answer within {TIMEOUT_S:g} s"
        return answer

    def _gpus(self, gpu: GpuWatch | None) -> tuple[tuple[str, ...] | None, str | None, str | None]:
        """What NVML says, through the shim's own GPU watch (no second NVML session): the GPUs the job can
        see, the driver and its CUDA version. A machine with no NVIDIA driver has none."""
        if gpu is None:
            if gpus_expected():
                self.unknown["gpus"] = "NVML was not read (the run ended at once, or it cannot be opened)"
                return None, None, None
            return (), None, None
        try:
            devices = gpu.devices or gpu.probe.devices()
            driver, cuda = gpu.probe.versions()
        except JobwardenError as err:
            self.unknown["gpus"] = err.message
            return None, None, None
        return probe.visible_gpus(devices, self.cuda_visible), driver, probe.cuda_version(cuda)

    def close(self) -> None:
        """The run is over: kill what is still running."""
        for helper in self.helpers.values():
            end_captured(helper)
        self.helpers.clear()
