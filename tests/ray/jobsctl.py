"""Ray Jobs through its SDK, for the tests, inside the namespace: submit jobs, wait until each is done,
report them, all in one process (each `ray job` command costs seconds of imports).

usage: jobsctl.py SPEC_JSON   with SPEC {"submit": [{"id", "entrypoint", "env"}], "wait": [id], "timeout_s"}
prints a JSON list, one {"id", "status", "driver_exit_code", "message", "logs"} per waited job."""

import json
import sys
import time

from ray.job_submission import JobStatus, JobSubmissionClient

spec = json.loads(sys.argv[1])
client = JobSubmissionClient("http://127.0.0.1:8265")
for job in spec.get("submit", []):
    runtime_env = {"env_vars": job.get("env", {})}
    client.submit_job(entrypoint=job["entrypoint"], submission_id=job["id"], runtime_env=runtime_env)
deadline = time.monotonic() + spec.get("timeout_s", 180)
report = []
for job_id in spec.get("wait", []):
    while (status := client.get_job_status(job_id)) not in (
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} still {status} at the deadline")
        time.sleep(0.2)  # Ray's SDK offers no way to block on a job's end: poll
    info = client.get_job_info(job_id)
    report.append(
        {
            "id": job_id,
            "status": str(info.status.value),
            "driver_exit_code": info.driver_exit_code,
            "message": info.message,
            "logs": client.get_job_logs(job_id),
        }
    )
print(json.dumps(report))
