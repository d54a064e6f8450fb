"""`inv report`'s page: every selected service's section (output/perfpage.py), from the releases
each host's `pipeline.releases` read, in the order the hosts and their services are listed."""
from __future__ import annotations

from ..output import perfpage


def page(hosts, reports) -> str:
    """The whole HTML page, from the hosts and their reports (a report's result: the releases)."""
    by_name = {h.name: h for h in hosts}
    sections = []
    for r in reports:
        for svc in by_name[r.name].get("services") or []:
            sections.append(perfpage.service_section(r.name, svc["name"], r.result.releases if r.result else [],
                                                     svc.get("gate")))
    return perfpage.page(sections)
