"""A job that writes numbered lines. It reports its pid on READY, writes FIRST lines, then waits for a
message on GO (a FIFO) saying how many more lines to write and with which exit code to end.

usage: ticker.py READY GO FIRST
"""

import os
import sys

ready, go, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(first):
    print(f"line {i}", flush=True)
with open(ready, "w") as fh:
    fh.write(f"{os.getpid()}\n")
with open(go) as fh:  # blocks until the test writes
    more, code = (int(x) for x in fh.read().split())
for i in range(first, first + more):
    print(f"line {i}", flush=True)
sys.exit(code)
