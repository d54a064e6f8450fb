"""Model modules; the server imports the one for the target's architecture at startup."""
