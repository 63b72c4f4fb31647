"""A Ray driver for the tests, run inside the namespace: connects to the head, waits for its two nodes,
runs rank.py under jobwarden.ray on each, and prints the per-node results as one JSON line.

usage: driver.py SPEC_JSON   with SPEC {"rank", "modes", "home", "ready", "mark", "stop_others_after_s"}"""

import json
import sys
import time

import ray

from jobwarden.ray import NodesFailed, run_on_nodes

spec = json.loads(sys.argv[1])
ray.init(address="127.0.0.1:6379")
deadline = time.monotonic() + 120
while sum(1 for n in ray.nodes() if n["Alive"]) < 2:
    if time.monotonic() > deadline:
        raise SystemExit("the cluster never had two alive nodes")
    time.sleep(0.2)  # Ray offers no way to block on a node joining: poll
command = ["python", spec["rank"], spec["modes"], spec.get("ready") or "-"]
try:
    marked = {"RAY_TEST_MARK": spec["mark"]}
    stop_after = spec.get("stop_others_after_s")
    results, error = (
        run_on_nodes(command, home=spec["home"], env=marked, stop_others_after_s=stop_after),
        None,
    )
except NodesFailed as failed:
    results, error = failed.results, str(failed)
print(json.dumps({"results": [r._asdict() for r in results], "error": error}))
