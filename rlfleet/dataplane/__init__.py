"""The data plane (issue 44): token payloads (ids, log-probs, loss masks, versions) travel from the
rollout replicas that made them to where they are used, over Apache Arrow Flight, without passing
through the controller, which keeps ids, versions, rewards, advantages, admission and the journal.

- payload.py: the payload of a group and its Arrow table (pure).
- store.py: where a replica holds its groups until they are fetched and released (the interface).
- flight.py: the Flight server that serves a store and the client that fetches from it (TLS, token).
"""
