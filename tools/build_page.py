"""Alias of ``tools/build.py PAGE ...`` (build the book, executing only the named pages)."""

import sys

from build import main

if __name__ == "__main__":
    if not sys.argv[1:]:
        sys.exit("usage: python tools/build_page.py PAGE [PAGE ...]")
    raise SystemExit(main(sys.argv[1:]))
