"""Reaching a host: SSH connections and host keys (`ssh`), getting past sudo (`become`), the
agent's session on the host (`session`) and the zip it travels in (`shipping`), the grants of a
host-to-host copy (`peercopy`), and the files installed on hosts as they are (`hostfiles/`).
"""
