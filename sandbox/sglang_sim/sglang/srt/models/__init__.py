"""Model modules; the server imports the one for the target's architecture at startup.

Each says, for /server_info and /model_info to report: MODEL_CODE ("upstream" here; a patch says
what it is), so a test sees which source the running process really loaded, and FILE_VERSION, the
SGLang release the file is from (the last release that changed it: see ../../versions/README.md),
so patched code of 0.5.24 is told from patched code of 0.5.23.  The 0.5.23 files are as long as
the whole-file patches in files/patches (the stale-bytecode trap test needs equal sizes)."""
