"""Check that the built site navigates when opened as files: every relative link of every page
names a file that exists (a link to a directory opens a listing from file://, not a page)."""

import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

site = Path(sys.argv[1] if len(sys.argv) > 1 else "site")
HREF = re.compile(r'(?:href|src)="([^"]*)"')
broken = []
pages = [page for page in sorted(site.rglob("*.html")) if page.name != "404.html"]  # served only
for page in pages:
    for target in HREF.findall(page.read_text(errors="replace")):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path:
            continue  # another site, or an anchor of this page
        path = (page.parent / unquote(parts.path)).resolve()
        if not path.is_file():
            broken.append(f"{page.relative_to(site)}: {target}")
if broken:
    print(f"{len(broken)} links of the site lead to no file:", *broken[:20], sep="\n  ")
    sys.exit(1)
print(f"The site navigates as files: {len(pages)} pages, every relative link leads to a file.")
