"""django-tasks-db's side of `make bench-peers` (django_peer.py does the work).

    bench/.venvs/tasks-db/bin/python bench/peers/tasksdb_driver.py --url URL [--workload w5|w2] --jobs N --processes P

Its worker is `db_worker`; W5 drains with `--batch`; its workers poll every 0.1 s here (1 s by default).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from django_peer import Peer, main  # noqa: E402

PEER = Peer(name="django-tasks-db", app="django_tasks_db", backend="django_tasks_db.DatabaseBackend",
            table="django_tasks_database_dbtaskresult", batch="--batch",
            worker=["db_worker", "--no-startup-delay", "--interval", "0.1"])

if __name__ == "__main__":
    main(PEER, os.path.abspath(__file__))
