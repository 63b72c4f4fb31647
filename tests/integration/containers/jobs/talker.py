"""A job that shows progress, falls silent on request, and comes back: the health probe's three states.

It prints a line every 0.2 s. A line on /t/hush (a FIFO) silences it (no output, no CPU: hung, to the
watchdog); a line on /t/wake makes it print again. It writes "ready" to /t/ready once it runs.
"""

import os
import select

hush = os.open("/t/hush", os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: the open never blocks, a close is no EOF
wake = os.open("/t/wake", os.O_RDWR | os.O_NONBLOCK)
with open("/t/ready", "w") as ready:
    ready.write("ready\n")
step = 0
while True:
    step += 1
    print(f"step {step}", flush=True)
    if select.select([hush], [], [], 0.2)[0]:
        os.read(hush, 64)
        select.select([wake], [], [])  # quiet until woken
        os.read(wake, 64)
