"""Roles: each a short checklist of ops built from a host's inventory vars."""
