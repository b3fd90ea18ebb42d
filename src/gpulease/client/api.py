"""GpuleaseClient: the server's REST API as resource groups (client.instances.create(...)).

Each group lives in a module of its own (client/instances.py, client/runs.py, ...); request
bodies and answers are the wire models of gpulease.schemas. All groups share one Transport
(client/base.py): the httpx client, the token, and how refusals become ApiError.
"""

from __future__ import annotations

from typing import Any, Unpack

from gpulease.client.accounts import AuthAPI, TokensAPI
from gpulease.client.admin import AdminAPI
from gpulease.client.autostop import AutostopAPI
from gpulease.client.base import Transport, TransportOptions
from gpulease.client.billing import BillingAPI, TeamsAPI
from gpulease.client.catalog import CatalogAPI, TemplatesAPI
from gpulease.client.closing import Closing
from gpulease.client.config import TrustedCertificate, resolve_login, trusted_certificate
from gpulease.client.datasets import DatasetsAPI
from gpulease.client.errors import NotLoggedIn
from gpulease.client.estimates import EstimatesAPI
from gpulease.client.instances import InstancesAPI
from gpulease.client.notifications import NotificationsAPI
from gpulease.client.runs import RunsAPI
from gpulease.client.statements import StatementsAPI
from gpulease.client.support import SupportAPI
from gpulease.client.sweeps import SweepsAPI


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
        self.auth = AuthAPI(self.api)
        self.tokens = TokensAPI(self.api)
        self.catalog = CatalogAPI(self.api)
        self.templates = TemplatesAPI(self.api)
        self.instances = InstancesAPI(self.api)
        self.autostop = AutostopAPI(self.api)
        self.runs = RunsAPI(self.api)
        self.billing = BillingAPI(self.api)
        self.teams = TeamsAPI(self.api)
        self.admin = AdminAPI(self.api)
        self.datasets = DatasetsAPI(self.api)
        self.estimates = EstimatesAPI(self.api)
        self.statements = StatementsAPI(self.api)
        self.notifications = NotificationsAPI(self.api)
        self.support = SupportAPI(self.api)
        self.sweeps = SweepsAPI(self.api)

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
