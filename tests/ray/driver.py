"""A Ray driver for the tests, run inside the namespace: connects to the head, waits for its two nodes,
runs rank.py (or the command given) under jobwarden.ray on each, and prints the per-node results (and
the group verdict) as one JSON line after REPORT.

usage: driver.py SPEC_JSON   with SPEC {"rank", "modes", "home", "ready", "mark", "stop_others_after_s",
"group_dir", "command", "rank_per_node"}: with a group dir, the group verdict too."""

import json
import sys
import time

import ray

from jobwarden.ray import NodesFailed, explain_group, run_on_nodes
from jobwarden.ray.warden import default_group

spec = json.loads(sys.argv[1])
ray.init(address="127.0.0.1:6379")
deadline = time.monotonic() + 120
while sum(1 for n in ray.nodes() if n["Alive"]) < 2:
    if time.monotonic() > deadline:
        raise SystemExit("the cluster never had two alive nodes")
    time.sleep(0.2)  # Ray offers no way to block on a node joining: poll
command = spec.get("command") or ["python", spec["rank"], spec["modes"], spec.get("ready") or "-"]
group = default_group()
try:
    results = run_on_nodes(
        command,
        group=group,
        home=spec["home"],
        group_dir=spec.get("group_dir"),
        env={"RAY_TEST_MARK": spec["mark"]},
        rank_per_node=spec.get("rank_per_node", True),
        stop_others_after_s=spec.get("stop_others_after_s"),
    )
    error = None
except NodesFailed as failed:
    results, error = failed.results, str(failed)
verdict = explain_group(group, spec["group_dir"]) if spec.get("group_dir") else None
# prefixed: Ray forwards the wardens' output to this stdout too, at any time
print("REPORT", json.dumps({"results": [r._asdict() for r in results], "error": error, "group": verdict}))
