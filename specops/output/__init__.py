"""What a run shows: the per-host report, recap and JSON, with secrets redacted (`report`), and
the HTML performance page of a host's releases (`perfpage`).
"""
