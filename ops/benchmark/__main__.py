import sys

from .run import main

if sys.argv[1:2] == ["client"]:  # ops/bench client: the Python client's hot path
    from . import client

    sys.exit(client.main(sys.argv[2:]))
if sys.argv[1:2] == ["strict"]:  # ops/bench strict: a strict tag's /id against a plain one's
    from . import strict

    sys.exit(strict.main(sys.argv[2:]))
sys.exit(main())
