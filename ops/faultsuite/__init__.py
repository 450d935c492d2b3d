"""Fault-injection suite: real idpool processes, Redis and MariaDB, faults, and an
account of every ID. Run it with ``ops/faults`` (see ops/README.md)."""
