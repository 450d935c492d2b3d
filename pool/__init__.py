"""The supply chain of idpool: MySQL ledger -> preloader -> Redis pool list.

Everything here raises; the service decides what to log and what to answer.
"""
