"""Programs the tests run, apart from the tests themselves: the chaos soak, PostgreSQL restarts,
worker hosts in network namespaces, a project with the durable tables on a database of their own,
the partition conversions, a wrong wall clock, and worker processes (workers.py).

Each of the first ones is a module run as ``python -m tests.harness.NAME`` (by a test, or by
``make chaos`` and ``make hosts``), in a process of its own.
"""
