"""The README and docs/ speak to users about the product: no page reads as the project's
development log (issue numbers, what a session or a commit did). History belongs in the commit
messages and bench/RESULTS.md."""

from __future__ import annotations

import re

from tests.conftest import ROOT

LOG = re.compile(r"\bissue #?\d+|\b(this|the next|the last|an earlier) session\b"
                 r"|\bthe commit before\b", re.IGNORECASE)


def test_no_page_reads_as_a_development_log():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
             for page in pages for number, line in enumerate(page.read_text().splitlines(), 1)
             if LOG.search(line)]
    assert not found, "Say it as a fact about the product, or move it to bench/RESULTS.md:\n" + "\n".join(found)


def test_performance_opens_with_one_table_for_both_databases_and_the_readme_quotes_it():
    page = (ROOT / "docs" / "performance.md").read_text()
    first = page.split("\n## ", 2)[1]
    assert first.startswith("At a glance"), first[:80]
    rows = {row.split(" | ")[0].strip("| `"): row.split(" | ")[1:] for row in first.splitlines()
            if row.startswith("| ") and not row.startswith("| ---")}
    assert rows["figure"] == ["PostgreSQL", "SQLite |"], rows["figure"]
    for figure in ("durable.start()", "durable.start_many()", "a short run", "ten-step", "django.tasks"):
        (found,) = [cells for name, cells in rows.items() if name.startswith(figure)]
        assert all(re.search(r"\d", cell) for cell in found), (figure, found)
    tasks = next(cells for name, cells in rows.items() if name.startswith("django.tasks"))
    headline = re.search(r"([\d,]+) tasks/s", tasks[0])[1]
    assert f"{headline} " in (ROOT / "README.md").read_text(), f"the README quotes {headline} tasks/s"
