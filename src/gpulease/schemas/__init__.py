"""The wire contract: the models that the server, the client and the runner exchange.

One module per resource; no I/O, nothing from `gpulease.server`. Import from the module
(`from gpulease.schemas.instances import InstancePublic`).
"""
