"""Several routers over the same real in-process workers (the helpers live in the package, where
the burst study uses them too)."""

from radixray.bench.inprocess_fleet import drain, fleet, hosts_for, join, until

__all__ = ["drain", "fleet", "hosts_for", "join", "until"]
