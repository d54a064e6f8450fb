"""What a run shows: the per-host report, recap and JSON, with secrets redacted (`report`), the
HTML performance page of a host's releases (`perfpage`, its SVG charts in `charts`), and the
listing of `inv releases` with its spec-bench lines (`releases`).
"""
