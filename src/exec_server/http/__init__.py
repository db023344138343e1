"""HTTP requests made on a client's behalf from the executor host (``http/request``).

:mod:`.request` validates a request and resolves header values from the
executor's environment (pure); :mod:`.client` sends it with httpx and streams
the body with a total deadline. Nothing here knows JSON-RPC: errors are the
classes of :mod:`.errors`, mapped to wire codes in :mod:`exec_server.exceptions`.
"""
