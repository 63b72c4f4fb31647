"""A parent that waits for a child which the test stops with SIGSTOP.

usage: stopped_child.py FIFO
"""

import subprocess
import sys

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open(sys.argv[1], "w") as f:
    f.write(f"{child.pid}\n")
child.wait()
