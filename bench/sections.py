"""A measurement of its own beside the tools' comparison: kept as bench/<name>.json and
bench/<name>.md, and as the section between `<!-- name -->` markers of BENCHMARKS.md (which
bench/run.py keeps when it rewrites the file)."""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def publish(name: str, result: dict, section: str) -> None:
    """`section` starts and ends with markers(name)."""
    print(json.dumps(result, indent=1))
    (HERE / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / f"{name}.md").write_text(section + "\n")
    mark, end = markers(name)
    bench = HERE.parent / "BENCHMARKS.md"
    text = bench.read_text()
    text = (text[:text.index(mark)] + section + text[text.index(end) + len(end):]) if mark in text \
        else text.rstrip() + "\n\n" + section + "\n"
    bench.write_text(text)
