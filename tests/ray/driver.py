"""A Ray driver for the tests, run inside the namespace: connects to the head, waits for its two nodes,
runs rank.py under jobwarden.ray on each, and prints the per-node results as one JSON line.

usage: driver.py SPEC_JSON   with SPEC {"rank", "modes", "home", "ready", "mark", "stop_others_after_s",
"group_dir"}: with a group dir, a failure's group verdict too."""

import json
import sys
import time

import ray

from jobwarden.ray import NodesFailed, explain_group, run_on_nodes

spec = json.loads(sys.argv[1])
ray.init(address="127.0.0.1:6379")
deadline = time.monotonic() + 120
while sum(1 for n in ray.nodes() if n["Alive"]) < 2:
    if time.monotonic() > deadline:
        raise SystemExit("the cluster never had two alive nodes")
    time.sleep(0.2)  # Ray offers no way to block on a node joining: poll
command = ["python", spec["rank"], spec["modes"], spec.get("ready") or "-"]
try:
    results = run_on_nodes(
        command,
        home=spec["home"],
        group_dir=spec.get("group_dir"),
        env={"RAY_TEST_MARK": spec["mark"]},
        rank_per_node=True,
        stop_others_after_s=spec.get("stop_others_after_s"),
    )
    error, group = None, None
except NodesFailed as failed:
    results, error = failed.results, str(failed)
    group = explain_group(failed.group, spec.get("group_dir")) if spec.get("group_dir") else None
print(json.dumps({"results": [r._asdict() for r in results], "error": error, "group": group}))
