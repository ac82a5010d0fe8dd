"""Container health check: GET /healthz on the port of KVCAST_METRICS_ADDR; exit 0 when 200."""

import os
import sys
import urllib.request

port = os.environ.get("KVCAST_METRICS_ADDR", "0.0.0.0:9400").rpartition(":")[2]
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:
    print(f"healthz: {exc}", file=sys.stderr)
    sys.exit(1)
