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
