"""Registered algorithm units of the learner: KL estimators, loss aggregations, policy losses,
off-policy corrections and the learner-side advantage estimators. Each is pure torch."""
