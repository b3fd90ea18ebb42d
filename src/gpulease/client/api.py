"""GpuleaseClient: the server's REST API as resource groups (client.instances.create(...)).

Each group lives in a module of its own (client/instances.py, client/runs.py, ...); request
bodies and answers are the wire models of gpulease.schemas. All groups share one Transport
(client/base.py): the httpx client, the token, and how refusals become ApiError.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Unpack

from gpulease.client.base import Transport, TransportOptions
from gpulease.client.closing import Closing
from gpulease.client.config import TrustedCertificate, resolve_login, trusted_certificate
from gpulease.client.errors import NotLoggedIn

if TYPE_CHECKING:
    from gpulease.client.accounts import AuthAPI, TokensAPI
    from gpulease.client.admin import AdminAPI
    from gpulease.client.autostop import AutostopAPI
    from gpulease.client.billing import BillingAPI, TeamsAPI
    from gpulease.client.catalog import CatalogAPI, TemplatesAPI
    from gpulease.client.datasets import DatasetsAPI
    from gpulease.client.estimates import EstimatesAPI
    from gpulease.client.instances import InstancesAPI
    from gpulease.client.notifications import NotificationsAPI
    from gpulease.client.runs import RunsAPI
    from gpulease.client.statements import StatementsAPI
    from gpulease.client.support import SupportAPI
    from gpulease.client.sweeps import SweepsAPI

# Each resource group: its attribute, the module of gpulease.client that defines it, its
# class. A group's module (and the wire models it loads) is imported on its first use, so
# that a command of one group does not pay for building the models of all of them.
_GROUPS = {
    "auth": ("accounts", "AuthAPI"),
    "tokens": ("accounts", "TokensAPI"),
    "catalog": ("catalog", "CatalogAPI"),
    "templates": ("catalog", "TemplatesAPI"),
    "instances": ("instances", "InstancesAPI"),
    "autostop": ("autostop", "AutostopAPI"),
    "runs": ("runs", "RunsAPI"),
    "billing": ("billing", "BillingAPI"),
    "teams": ("billing", "TeamsAPI"),
    "admin": ("admin", "AdminAPI"),
    "datasets": ("datasets", "DatasetsAPI"),
    "estimates": ("estimates", "EstimatesAPI"),
    "statements": ("statements", "StatementsAPI"),
    "notifications": ("notifications", "NotificationsAPI"),
    "support": ("support", "SupportAPI"),
    "sweeps": ("sweeps", "SweepsAPI"),
}


class GpuleaseClient(Closing):
    """One gpulease server, as one user (or anonymously, for register and login).

    `options` say how to reach it (see Transport): `http`, a Starlette TestClient to run
    against the ASGI app in process (the caller keeps owning it); `transport`, for the
    httpx.Client the client makes itself; `timeout`; `trusted`, the certificate pinned for
    an https server with a self-signed one (client/trust.py).

    Every refusal raises ApiError(status, the server's message); no answer at all raises
    ServerUnreachable naming the URL; a pinned certificate that changed, CertificateChanged.
    """

    def __init__(
        self, server_url: str, token: str | None = None, **options: Unpack[TransportOptions]
    ) -> None:
        self.api = Transport(server_url, token, **options)

    if TYPE_CHECKING:  # made on first use by __getattr__
        auth: AuthAPI
        tokens: TokensAPI
        catalog: CatalogAPI
        templates: TemplatesAPI
        instances: InstancesAPI
        autostop: AutostopAPI
        runs: RunsAPI
        billing: BillingAPI
        teams: TeamsAPI
        admin: AdminAPI
        datasets: DatasetsAPI
        estimates: EstimatesAPI
        statements: StatementsAPI
        notifications: NotificationsAPI
        support: SupportAPI
        sweeps: SweepsAPI

    else:  # hidden from type checkers, so that a misspelt group is still an error there

        def __getattr__(self, name: str) -> Any:
            """A resource group on its first use: its module imported, the group made on
            the shared transport and kept as an attribute (later uses do not come here;
            groups hold nothing but the transport, so two threads making one at once is
            harmless)."""
            home = _GROUPS.get(name)
            if home is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            module, cls = home
            group = getattr(importlib.import_module(f"gpulease.client.{module}"), cls)(self.api)
            setattr(self, name, group)
            return group

    @classmethod
    def from_saved_login(cls, **kwargs: Any) -> GpuleaseClient:
        """A client for the saved login (GPULEASE_SERVER / GPULEASE_TOKEN override it)."""
        login = resolve_login()
        if login.server is None:
            raise NotLoggedIn("not logged in: run `gpulease login --server URL` first")
        kwargs.setdefault("trusted", trusted_certificate(login.server))
        return cls(login.server, login.token, **kwargs)

    @property
    def server_url(self) -> str:
        return self.api.server_url

    @property
    def token(self) -> str | None:
        """The API token in use; register and login replace it."""
        return self.api.token

    @token.setter
    def token(self, value: str | None) -> None:
        self.api.token = value

    @property
    def trusted(self) -> TrustedCertificate | None:
        return self.api.trusted

    def close(self) -> None:
        self.api.close()
