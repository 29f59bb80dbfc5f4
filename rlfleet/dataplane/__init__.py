"""The data plane (issue 44): token payloads (ids, log-probs, loss masks, versions) travel from the
rollout replicas that made them to where they are used, over Apache Arrow Flight, without passing
through the controller, which keeps ids, versions, rewards, advantages, admission and the journal.

- payload.py: the payload of a group and its Arrow table (pure).
- columns.py: a payload table as each group's compact columns, checked (the learner's form).
- store.py: where a replica holds its groups until they are fetched and released (the interface).
- flight.py: the Flight server that serves a store and the client that fetches from it (TLS, token).
- staging.py: the learner's staging store, where replicas push each group once generated (bounded).
- push.py: a replica's background sender of its groups to that store (off the Generate stream).
- plane.py: the two ends around the services (hold; fetch what is not staged, fill what is).
"""
