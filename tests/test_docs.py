"""The repository explains itself: no code, test or doc points a reader at documents outside it."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTSIDE = re.compile(r"\bseed \d{3}\b|\bseeds?/|\.\./shared\b|\bRANGEIFY\.md\b|\bCODEGEN\.md\b", re.IGNORECASE)


def repository_texts():
    for folder in ("zeptograd", "tests", "docs", "examples", "bench"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if f.endswith((".py", ".md")):
                    yield os.path.join(dirpath, f)
    yield os.path.join(ROOT, "README.md")


def test_no_references_to_documents_outside_the_repository():
    hits = []
    for path in repository_texts():
        if path == os.path.abspath(__file__):
            continue
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if OUTSIDE.search(line):
                    hits.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)
