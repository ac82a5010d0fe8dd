"""What leaves the process (metrics, HTTP, the status page, dead letters) and, in ``kit/``,
what engines import (the table client, the plugins, the eviction adapters and the table's
reading side; the kit's rule is in ``exporters/kit/__init__.py``)."""
