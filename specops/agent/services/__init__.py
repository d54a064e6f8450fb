"""The services on the host: stopping and starting units with every process accounted for
(`units`, `procs`), GPUs and who holds them (`gpus`), who listens on a port (`listeners`), a
start followed (`startup`), verify and peek over HTTP (`service_http`, `http`), membership in a
router (`routing`), and the end of a GPU window's job (`window`)."""
