"""django-ox's side of `make bench-peers` (django_peer.py does the work).

    bench/.venvs/ox/bin/python bench/peers/ox_driver.py --url URL [--workload w5|w2] --jobs N --processes P

Tuned as its documentation advises: persistent connections (CONN_MAX_AGE, as in its published
figures). Its worker is `ox_worker`; W5 drains with `--batch` (one process each: its --processes
does not combine with --batch); it polls every 0.05 s here (1 s by default).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from django_peer import Peer, main  # noqa: E402

PEER = Peer(name="django-ox", app="django_ox", backend="django_ox.backend.OxBackend", table="django_ox_oxtask",
            batch="--batch", worker=["ox_worker", "--interval", "0.05"],
            database={"CONN_MAX_AGE": 600, "CONN_HEALTH_CHECKS": True})

if __name__ == "__main__":
    main(PEER, os.path.abspath(__file__))
