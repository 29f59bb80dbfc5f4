"""A plaintext replica joining a controller that serves TLS is told so (issue 32).

The reliability re-run's plaintext joiner against a TLS controller ended with "Socket closed", which
names neither TLS nor what to change. Now the replica's line says the controller may use TLS and that
its security settings must match the job's."""
from __future__ import annotations

import pytest

from controller.status_servicer import start_status_server
from rlfleet.app.fleet_member import FleetMembership
from rlfleet.errors import ServiceUnavailable
from rlfleet.rpc.security import Security
from tests.tls_certs import make_pki

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def test_a_plaintext_joiner_against_a_tls_controller_is_told_about_tls(tmp_path, tiny_model_dir):
    pki = make_pki(tmp_path / "pki")
    security = Security(cert=pki.server_cert.read_bytes(), key=pki.server_key.read_bytes(),
                        ca=pki.ca.read_bytes())
    server = start_status_server("127.0.0.1", 0, "tls", {}, lambda: None, security)
    member = FleetMembership(server.address, Security(), "plain", tiny_model_dir, wait_s=3.0)
    try:
        with pytest.raises(ServiceUnavailable) as err:
            member.join("127.0.0.1:1")
    finally:
        member.close()
        server.stop(grace_s=0)
    message = str(err.value)
    assert "TLS" in message and "security" in message, message
