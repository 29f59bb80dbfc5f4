"""Math more than one role needs (token log-probs), kept in the core so roles need not import each other."""
