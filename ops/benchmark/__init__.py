"""The benchmark behind ``ops/bench``: idpool against a bare-Starlette ceiling and
the ID services a user would pick instead, on loopback, in one run.

``apps.py`` holds the contenders that are not idpool itself (uvicorn factories),
``load.py`` drives wrk, ``micro.py`` times the in-process hot path, ``run.py``
starts everything, runs the plan and writes the table and the JSON file.
Nothing here is imported by idpool; ``make test`` only lints and type-checks it.
"""
