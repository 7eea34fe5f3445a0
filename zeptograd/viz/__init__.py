"""VIZ=1: record what the compiler did (schedules, every whole-graph rewrite of each kernel, sources, run times) and
show it in a local web page.

- `viz/record.py` — the recorder the core's hooks call (each guarded by `if VIZ.value`, so nothing exists when off).
- `viz/trace.py` — the versioned JSON trace: graphs as node tables, writing, reading and checking a file.
- `viz/server.py` — serves the page and a trace on 127.0.0.1; `python -m zeptograd.viz FILE` (viz/__main__.py).
- `viz/static/` — the page (index.html, viz.js, viz.css) and the vendored libraries (static/vendor/, VERSIONS.txt).

The hooks import this package only with VIZ on: a process without it neither imports nor compiles any of it.
"""
