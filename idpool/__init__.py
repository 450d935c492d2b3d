"""idpool: a distributed 64-bit ID service (MySQL ledger, Redis segment pool, HTTP nodes).

The server installs as this one package: ``idpool.pool`` is the supply chain
(the folder ``pool/``), ``idpool.service`` the node (the folder ``service/``).
"""
