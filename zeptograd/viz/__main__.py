"""`python -m zeptograd.viz TRACE_FILE`: serve a saved VIZ trace on 127.0.0.1 (port VIZ_PORT, default 8000)."""

import sys

from zeptograd.helpers import ArgumentError
from zeptograd.viz.server import serve


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m zeptograd.viz TRACE_FILE  (a trace VIZ=1 wrote; VIZ_PORT picks the port)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        serve(argv[0])
    except (ArgumentError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
