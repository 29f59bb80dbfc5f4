"""The learner's algorithm units: KL estimators, loss aggregations, policy losses and off-policy
corrections, each pure torch. Their names are registered in rlfleet.extensions (by import path, so
the config is checked without torch); the learner-side advantage estimators are rlfleet.advantages."""
