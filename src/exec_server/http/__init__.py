"""HTTP requests made on a client's behalf from the executor host (``http/request``).

:mod:`.request` validates (pure), :mod:`.client` sends with httpx; no JSON-RPC here.
"""
