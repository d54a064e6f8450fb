"""spec-bench on the host: the load client (`specbench`) and the baseline server without
speculation (`baseline`)."""
