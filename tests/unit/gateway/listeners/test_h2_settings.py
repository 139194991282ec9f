"""Compacted HTTP/2 settings (gateway/listeners/h2_settings.py) behave as h2's own through a
settings change after the handshake, in both directions."""

from __future__ import annotations

import collections

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes

from gateway.listeners.h2_settings import SettingValues, compact


def _pair() -> tuple[H2Connection, H2Connection]:
    client = H2Connection(H2Configuration(client_side=True))
    server = H2Connection(H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    _exchange(client, server)
    return client, server


def _exchange(client: H2Connection, server: H2Connection) -> None:
    for _ in range(3):
        server.receive_data(client.data_to_send())
        client.receive_data(server.data_to_send())


def _kinds(conn: H2Connection) -> set[type]:
    values = {**conn.local_settings._settings, **conn.remote_settings._settings}
    return {type(v) for v in values.values()}


def test_compact_replaces_every_deque_and_keeps_the_values() -> None:
    _, server = _pair()
    before = dict(server.local_settings), dict(server.remote_settings)
    compact(server.local_settings)
    compact(server.remote_settings)
    assert _kinds(server) == {SettingValues}
    assert (dict(server.local_settings), dict(server.remote_settings)) == before


def test_a_settings_change_after_compaction_is_applied_on_acknowledgement() -> None:
    client, server = _pair()
    compact(server.local_settings)
    compact(server.remote_settings)
    # The server changes its own setting: pending until the client acknowledges it.
    server.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: 7})
    assert len(server.local_settings._settings[SettingCodes.MAX_CONCURRENT_STREAMS]) == 2
    _exchange(client, server)
    assert server.local_settings.max_concurrent_streams == 7
    assert client.remote_settings.max_concurrent_streams == 7
    # The client changes one of its own, including one the server has not seen before.
    client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1000, 0x99: 3})
    _exchange(client, server)
    assert server.remote_settings.initial_window_size == 1000
    assert server.remote_settings[0x99] == 3
    # A new key arrives as a fresh deque: compacting again takes it too.
    assert collections.deque in _kinds(server)
    compact(server.remote_settings)
    assert _kinds(server) == {SettingValues}
