"""What the tasks run, beyond applying roles: a deploy with its verify, undo and bench
(`pipeline`), rolling deploys behind a router (`rolling`), spec-bench and its gate (`specbench`),
`status` and `facts`, and the checks that what runs is what was deployed (`verify`).
"""
