"""Environment servers: the servicer of the rlfleet.v1.Environment contract over any
rlfleet.env.Environment, and the built-in environments (calculator, python, digits_game).

A package of its own, beside the roles: it imports only the core (the Python tool runs on the
core's code sandbox, rlfleet.sandbox), and the rollout meets it only through the contract.
"""
