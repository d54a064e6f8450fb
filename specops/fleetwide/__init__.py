"""Tasks that run on the controller alone, over the inventory as a whole: they connect to no host
(or only read what a flow brought back), and make something of the fleet's picture.

What belongs here: a body that takes the inventory (or the reports a flow returned) and writes
or prints something for the whole fleet.  What does not: a body run once per host over its
connection (that is a flow: specops/flows/), an op or a role (specops/ops/, roles/), or what a
run shows of itself (specops/output/).

- `monitoring`: `inv monitoring`'s Prometheus configuration, from `targets` (who to scrape,
  with which labels) and `rules` (recording rules and alerts), and its Grafana dashboard
  (`dashboard`);
- `payoff`: a service's `watch:` and whether its draft still pays, judged once for the alerts
  and `inv status`;
- `report`: `inv report`'s page, from the releases each host's flow read.
"""
