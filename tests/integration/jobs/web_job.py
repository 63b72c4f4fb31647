"""A job driven line by line by a test: prints "line before", says READY, then obeys each message on GO
(a FIFO): "print TEXT" prints TEXT and says READY again, "raise" dies of a ValueError.

usage: web_job.py READY GO
"""

import sys

ready, go = sys.argv[1], sys.argv[2]


def say_ready():
    with open(ready, "w") as fh:
        fh.write("ready\n")


print("line before", flush=True)
say_ready()
while True:
    with open(go) as fh:  # blocks until the test writes
        command = fh.read().strip()
    if command.startswith("print "):
        print(command[len("print ") :], flush=True)
        say_ready()
    elif command == "raise":
        raise ValueError("boom from the web test")
