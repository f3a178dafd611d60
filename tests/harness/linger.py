"""A harness that starts a process group of its own (as harnesses start worker supervisors), writes
its pid to the file named by its argument, and never ends: tests/test_harnesses.py ends it by its
time limit and shows that nothing it started outlives it."""

import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(sys.argv[1]).write_text(str(child.pid))
    time.sleep(600)
