"""What leaves the process (metrics, HTTP, the status page) and what engines import (the
table client and its eviction adapters)."""
