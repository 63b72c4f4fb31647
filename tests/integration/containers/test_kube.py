"""The README's Dockerfile and Kubernetes Job, as far as a machine without a kubelet can play them: an image
with the README's ENTRYPOINT and CMD (on the test's root file system: no registry here), and the Job's pod
template played as a Pod by `podman kube play` (it plays Pods, not Jobs): restartPolicy, the memory limit,
the liveness probe and the container's exit code.

What only a real cluster can check, said plainly: the Job controller's podFailurePolicy and backoffLimit
(here a few lines below apply the policy's rules to the exit codes real containers gave), the kubelet's
/dev/termination-log mount and `kubectl describe pod` (kube play mounts nothing there: the test entrypoint
tests mount a file as the kubelet does), terminationGracePeriodSeconds (kube play keeps podman's 10 s),
and the kubelet running the liveness probe and restarting on it (podman's healthcheck timer needs systemd,
absent here: the probe is run by hand)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containerkit import VENV, Podman
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.container]

README = Path(__file__).resolve().parents[3] / "README.md"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TRAIN = """\
import os, signal, sys, time
mode = sys.argv[1] if len(sys.argv) > 1 else "fail"
print("training", sys.argv[1:], flush=True)
if mode == "fail":
    raise SystemExit(3)
if mode == "killed":  # preempted: killed from outside, no OOM
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "oom":
    hog = []
    while True:
        hog.append(bytearray(10 << 20))
with open("/tmp/ready", "w") as ready:
    ready.write("ready")
while True:
    time.sleep(3600)
"""


def _block(language: str, must_contain: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)
    (found,) = [b for b in blocks if must_contain in b]
    return str(found)


def readme_job() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(_block("yaml", "kind: Job"))
    return job


def readme_dockerfile_lines() -> list[str]:
    """The README's ENTRYPOINT and CMD, verbatim: the contract the image gives the job."""
    lines = _block("dockerfile", "ENTRYPOINT").splitlines()
    return [line for line in lines if line.startswith(("ENTRYPOINT", "CMD", "WORKDIR"))]


@pytest.fixture(scope="module")
def image(podman_session: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The root file system imported as an image, the session's /opt/jw and train.py copied in, and the
    README's ENTRYPOINT and CMD."""
    podman = podman_session
    context = tmp_path_factory.mktemp("image")
    assert podman.venv is not None
    shutil.copytree(podman.venv, context / "opt-jw", symlinks=True)
    (context / "train.py").write_text(TRAIN)
    base, tag = f"localhost/{podman.prefix}-base", f"localhost/{podman.prefix}-train"
    with open(context / "rootfs.tar", "wb") as tar:
        subprocess.run(["tar", "-C", str(podman.rootfs), "-c", "."], stdout=tar, check=True, timeout=300)
    podman.check("import", "--change", f"ENV PATH={PATH}", str(context / "rootfs.tar"), base, timeout=300)
    (context / "rootfs.tar").unlink()
    (context / "Containerfile").write_text(
        "\n".join(
            [
                f"FROM {base}",
                f"COPY opt-jw {VENV}",
                "COPY train.py /work/train.py",
                *readme_dockerfile_lines(),
            ]
        )
        + "\n"
    )
    podman.check("build", "--quiet", "--pull=never", "-t", tag, str(context), timeout=300)
    try:
        yield tag
    finally:
        podman("rmi", "--force", tag, base, timeout=120)


class Pod:
    def __init__(self, podman: Podman, spec: dict[str, Any], directory: Path) -> None:
        self.podman, self.name = podman, f"{podman.prefix}-{spec['metadata']['name']}"
        spec["metadata"]["name"] = self.name
        self.file = directory / f"{self.name}.yaml"
        self.file.write_text(yaml.safe_dump(spec))
        self.container = f"{self.name}-{spec['spec']['containers'][0]['name']}"

    def play(self) -> None:
        self.podman.check("kube", "play", "--network", "none", str(self.file))

    def inspect(self, template: str) -> str:
        return self.podman.check("inspect", self.container, "--format", template).strip()

    def down(self) -> None:
        self.podman("pod", "rm", "--force", "--time", "0", self.name, timeout=60)


def pod_from_job(
    job: dict[str, Any], image: str, name: str, args: list[str], memory: str | None = None
) -> dict[str, Any]:
    """The Job's pod template as a Pod, on the test's image; only the job's arguments (and, for the OOM,
    a memory limit this machine can fill) differ from the README's."""
    assert job["kind"] == "Job"
    template = job["spec"]["template"]
    container = dict(template["spec"]["containers"][0], image=image, args=args)
    if memory is not None:
        container["resources"] = {"limits": {"memory": memory}}
    spec = dict(template["spec"], containers=[container])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def pods(podman_session: Podman, tmp_path: Path) -> Iterator[list[Pod]]:
    made: list[Pod] = []
    yield made
    for pod in made:
        pod.down()


def _play(podman: Podman, tmp: Path, made: list[Pod], spec: dict[str, Any]) -> Pod:
    pod = Pod(podman, spec, tmp)
    made.append(pod)
    pod.play()
    return pod


def _exit_code(pod: Pod) -> int:
    return int(pod.podman.check("wait", pod.container, timeout=120).strip())


def test_the_readmes_job_runs_as_a_pod(
    podman_session: Podman, image: str, tmp_path: Path, pods: list[Pod]
) -> None:
    job = readme_job()
    limit = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    failing = _play(
        podman_session, tmp_path, pods, pod_from_job(job, image, "fail", ["python", "train.py", "fail"])
    )
    assert _exit_code(failing) == 3  # the job's own status
    assert failing.inspect("{{.HostConfig.RestartPolicy.Name}}") == "no"  # restartPolicy: Never
    assert int(failing.inspect("{{.HostConfig.Memory}}")) == _bytes(limit)
    logs = podman_session("logs", failing.container)
    assert "training ['fail']" in logs.stdout  # the job's output, and the verdict last on stderr
    assert logs.stderr.splitlines()[0].startswith("jobwarden: job 1 (train.py) failed: exit code 3"), (
        logs.stderr
    )
    killed = _play(
        podman_session, tmp_path, pods, pod_from_job(job, image, "killed", ["python", "train.py", "killed"])
    )
    oom = _play(
        podman_session,
        tmp_path,
        pods,
        pod_from_job(job, image, "oom", ["python", "train.py", "oom"], memory="150Mi"),
    )
    codes = {"fail": 3, "killed": _exit_code(killed), "oom": _exit_code(oom)}
    assert codes == {"fail": 3, "killed": 200, "oom": 137}
    # the Job controller's side, which only a cluster runs: the README's podFailurePolicy applied to them
    policy = job["spec"]["podFailurePolicy"]["rules"]
    assert {name: _policy_action(policy, "train", code) for name, code in codes.items()} == {
        "fail": "Count",  # retried up to backoffLimit: a hang or crash may pass
        "killed": "Ignore",  # retried, not counted: not the job's fault
        "oom": "Count",
    }


def test_the_liveness_probe_is_jobwarden_health(
    podman_session: Podman, image: str, tmp_path: Path, pods: list[Pod]
) -> None:
    job = readme_job()
    probe = job["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    assert probe["exec"]["command"] == ["jobwarden", "health"]
    pod = _play(
        podman_session, tmp_path, pods, pod_from_job(job, image, "probe", ["python", "train.py", "wait"])
    )
    eventually(
        "the job never started",
        lambda: podman_session("exec", pod.container, "test", "-e", "/tmp/ready").returncode == 0,
        60,
        every_s=0.1,
    )
    # kube play turned the probe into the container's healthcheck; its timer needs systemd: run by hand
    assert "jobwarden health" in pod.inspect("{{.Config.Healthcheck.Test}}")
    assert podman_session("healthcheck", "run", pod.container).returncode == 0


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(quantity[:-2]) * units[quantity[-2:]]


def _policy_action(rules: list[dict[str, Any]], container: str, code: int) -> str:
    """Kubernetes' podFailurePolicy for a failed pod whose one container exited `code`: the first rule that
    matches decides; none matching is Count (the backoffLimit's)."""
    for rule in rules:
        on = rule.get("onExitCodes")
        if on is None or on.get("containerName", container) != container:
            continue
        inside = code in on["values"]
        if inside == (on["operator"] == "In"):
            return str(rule["action"])
    return "Count"
