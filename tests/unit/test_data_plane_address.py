"""rlfleet/app/serve.py data_plane_address: the address a rollout replica gives for its data plane
(controller.data_plane=flight) is reachable where its gRPC address is: --advertise's host with the Flight
server's own port, the bound host otherwise, a wildcard bind resolved towards the controller."""
from __future__ import annotations

import pytest

from rlfleet.app.serve import data_plane_address

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("advertise, expected", [
    (None, "127.0.0.1:5555"),
    ("10.1.2.3", "10.1.2.3:5555"),
    ("10.1.2.3:7000", "10.1.2.3:5555"),  # the advertised port is the gRPC server's, not the data plane's
    ("[fd00::1]:7000", "[fd00::1]:5555"),
    ("[fd00::1]", "[fd00::1]:5555"),
    ("node-7.cluster", "node-7.cluster:5555"),
])
def test_advertised_host_with_the_flight_port(advertise, expected):
    assert data_plane_address("127.0.0.1", 5555, advertise, None) == expected


def test_a_wildcard_bind_names_the_interface_towards_the_controller():
    assert data_plane_address("0.0.0.0", 5555, None, "127.0.0.1:9") == "127.0.0.1:5555"
