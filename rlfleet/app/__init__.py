"""The composition root: the `rlfleet` command, the local launcher and supervisor, `serve`, `status`,
`eval`, `plot`, the reward SDK and `reward check`. It may import every role; nothing imports it."""
